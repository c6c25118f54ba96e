"""Writing OAuth grants' last_used_at in batches, so an OAuth caller's request never writes."""

from __future__ import annotations

import asyncio
import logging
import uuid

import asyncpg
from aiohttp import web

from gateway.accounts.access import AUTHENTICATOR
from gateway.db import oauth_grants as grants_db
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.keys import POOL
from gateway.oauth.resources import Grants

log = logging.getLogger(__name__)

FLUSH_SECONDS = 30.0


async def flush_grant_usage(pool: asyncpg.Pool, grants: Grants) -> None:
    usage, grants.usage = grants.usage, {}
    if not usage:
        return
    try:
        await grants_db.touch(pool, usage)
    except DATABASE_ERRORS as exc:
        log.warning("could not record OAuth grant usage, will retry: %s", exc)
        _merge_back(grants, usage)


def _merge_back(grants: Grants, usage: dict[uuid.UUID, float]) -> None:
    # Uses recorded meanwhile are newer: kept over the batch that failed.
    for grant_id, used_at in usage.items():
        if grants.usage.get(grant_id, 0.0) < used_at:
            grants.usage[grant_id] = used_at


async def record_grant_usage(pool: asyncpg.Pool, grants: Grants) -> None:
    try:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            await flush_grant_usage(pool, grants)
    finally:
        await flush_grant_usage(pool, grants)


async def run(app: web.Application) -> None:
    """The loop as the app starts it."""
    await record_grant_usage(app[POOL], app[AUTHENTICATOR].grants)
