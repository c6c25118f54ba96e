"""Writing API keys' last_used_at in batches, so the hot path never writes per request."""

from __future__ import annotations

import asyncio
import logging
import uuid

import asyncpg
from aiohttp import web

from gateway.accounts.access import AUTHENTICATOR, Authenticator
from gateway.db import api_keys as api_keys_db
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.keys import POOL

log = logging.getLogger(__name__)

FLUSH_SECONDS = 30.0


async def flush_key_usage(pool: asyncpg.Pool, authenticator: Authenticator) -> None:
    usage, authenticator.key_usage = authenticator.key_usage, {}
    if not usage:
        return
    try:
        await api_keys_db.touch(pool, usage)
    except DATABASE_ERRORS as exc:
        log.warning("could not record API key usage, will retry: %s", exc)
        _merge_back(authenticator, usage)


def _merge_back(authenticator: Authenticator, usage: dict[uuid.UUID, float]) -> None:
    for key_id, used_at in usage.items():
        if authenticator.key_usage.get(key_id, 0.0) < used_at:
            authenticator.key_usage[key_id] = used_at


async def record_key_usage(pool: asyncpg.Pool, authenticator: Authenticator) -> None:
    try:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            await flush_key_usage(pool, authenticator)
    finally:
        await flush_key_usage(pool, authenticator)


async def run(app: web.Application) -> None:
    """The loop as the app starts it."""
    await record_key_usage(app[POOL], app[AUTHENTICATOR])
