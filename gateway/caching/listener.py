"""LISTEN for cache invalidations from every gateway process, reconnecting when cut off."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
from aiohttp import web

from gateway.caching.caches import CACHES, Caches
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.keys import SETTINGS

log = logging.getLogger(__name__)

CHANNEL = "gateway_invalidate"
_PING_SECONDS = 15.0


async def listen_for_invalidations(dsn: str, caches: Caches) -> None:
    backoff = 0.5
    while True:
        try:
            conn = await asyncpg.connect(dsn)
        except DATABASE_ERRORS as exc:
            log.warning("cache listener cannot connect (%s); retrying in %.1f s", exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
            continue
        backoff = 0.5
        try:
            await _listen(conn, caches)
        except DATABASE_ERRORS as exc:
            log.warning("cache listener lost its connection: %s", exc)
        finally:
            caches.set_listening(False)
            await _close(conn)


async def _listen(conn: asyncpg.Connection, caches: Caches) -> None:
    lost = asyncio.Event()

    def on_notify(_conn: Any, _pid: int, _channel: str, payload: object) -> None:
        caches.invalidate(str(payload))

    conn.add_termination_listener(lambda _conn: lost.set())
    await conn.add_listener(CHANNEL, on_notify)
    caches.set_listening(True)
    while not lost.is_set():
        # A silently dropped connection never reports itself: ping to find out.
        try:
            await asyncio.wait_for(lost.wait(), timeout=_PING_SECONDS)
        except TimeoutError:
            await conn.fetchval("SELECT 1", timeout=5)


async def _close(conn: asyncpg.Connection) -> None:
    try:
        await asyncio.wait_for(conn.close(), timeout=2)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
        conn.terminate()


async def run(app: web.Application) -> None:
    """The loop as the app starts it."""
    database_url = app[SETTINGS].database_url
    assert database_url is not None, "the app has a database by the time its loops start"
    await listen_for_invalidations(database_url, app[CACHES])
