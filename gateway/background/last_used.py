"""Writing when API keys and OAuth grants were last used, in batches, so that no request writes.

The hot path only notes the time in a dict (id -> epoch seconds) its owner holds; this loop
takes each dict every FLUSH_SECONDS and stores it with one statement. A batch that cannot be
written goes back, under any newer uses noted meanwhile, for the next round.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiohttp import web

from gateway.accounts.access import AUTHENTICATOR
from gateway.db import api_keys as api_keys_db
from gateway.db import oauth_grants as grants_db
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.keys import POOL

log = logging.getLogger(__name__)

FLUSH_SECONDS = 30.0

Uses = dict[uuid.UUID, float]


@dataclass(frozen=True, slots=True)
class LastUsed:
    """One kind of thing whose last use is recorded: the dict attribute of `owner` its uses
    gather in, and the SQL that stores a batch of them."""

    what: str
    owner: Any
    attribute: str
    touch: Callable[[asyncpg.Pool, Uses], Awaitable[None]]

    async def flush(self, pool: asyncpg.Pool) -> None:
        usage: Uses = getattr(self.owner, self.attribute)
        if not usage:
            return
        setattr(self.owner, self.attribute, {})
        try:
            await self.touch(pool, usage)
        except DATABASE_ERRORS as exc:
            log.warning("could not record %s usage, will retry: %s", self.what, exc)
            noted: Uses = getattr(self.owner, self.attribute)
            for item_id, used_at in usage.items():
                if noted.get(item_id, 0.0) < used_at:
                    noted[item_id] = used_at


def recorded(app: web.Application) -> tuple[LastUsed, ...]:
    authenticator = app[AUTHENTICATOR]
    return (
        LastUsed("API key", authenticator, "key_usage", api_keys_db.touch),
        LastUsed("OAuth grant", authenticator.grants, "usage", grants_db.touch),
    )


async def flush(pool: asyncpg.Pool, kinds: tuple[LastUsed, ...]) -> None:
    for kind in kinds:
        await kind.flush(pool)


async def run(app: web.Application) -> None:
    """The loop as the app starts it; what is noted last is written as the app stops."""
    pool, kinds = app[POOL], recorded(app)
    try:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            await flush(pool, kinds)
    finally:
        await flush(pool, kinds)
