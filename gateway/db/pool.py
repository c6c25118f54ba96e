"""The asyncpg connection pool, with every wait on the database bounded."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import asyncpg
import orjson


async def _init_connection(conn: asyncpg.Connection) -> None:
    for json_type in ("json", "jsonb"):
        await conn.set_type_codec(
            json_type,
            schema="pg_catalog",
            encoder=lambda v: orjson.dumps(v).decode(),
            decoder=orjson.loads,
        )


class BoundedPool(asyncpg.Pool):
    """A pool whose acquire() and release() give up after `wait_timeout` unless told
    otherwise: with PostgreSQL frozen, a request fails (TimeoutError: a 503) instead of
    hanging, and a connection that cannot be reset is closed instead of waited on."""

    def __init__(
        self,
        *args: Any,
        wait_timeout: float | None = None,
        on_wait: Callable[[float], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._wait_timeout = wait_timeout
        # Told how long each acquire waited (the metrics' pool wait histogram).
        self._on_wait = on_wait

    async def _acquire(self, timeout: float | None) -> Any:  # noqa: ASYNC109 -- asyncpg's
        # The coroutine behind acquire() in asyncpg (not in its type stubs), which both its
        # context manager and `await pool.acquire()` go through.
        if self._on_wait is None:
            return await super()._acquire(timeout)  # type: ignore[misc]
        started = time.perf_counter()
        connection = await super()._acquire(timeout)  # type: ignore[misc]
        self._on_wait(time.perf_counter() - started)
        return connection

    def acquire(self, *, timeout: float | None = None) -> Any:
        return super().acquire(timeout=self._wait_timeout if timeout is None else timeout)

    # asyncpg.Pool.release's own signature, timeout included.
    async def release(
        self,
        connection: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        await super().release(
            connection, timeout=self._wait_timeout if timeout is None else timeout
        )


async def create_pool(
    dsn: str,
    *,
    min_size: int = 2,
    max_size: int = 20,
    acquire_timeout: float | None = None,
    statement_timeout: float | None = None,
    on_wait: Callable[[float], None] | None = None,
) -> asyncpg.Pool:
    """`acquire_timeout` bounds waiting for a connection (and for returning one);
    `statement_timeout` each statement, both in the client (a frozen server answers nothing)
    and in PostgreSQL (a runaway query is cancelled there). None: no bound (the CLI's long
    maintenance statements)."""
    settings = {}
    if statement_timeout is not None:
        settings["statement_timeout"] = str(int(statement_timeout * 1000))
    pool = BoundedPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        # Connections that lived through a PostgreSQL restart are dropped and replaced.
        max_inactive_connection_lifetime=60,
        command_timeout=statement_timeout,
        server_settings=settings,
        wait_timeout=acquire_timeout,
        on_wait=on_wait,
        # asyncpg.create_pool's defaults for the rest.
        max_queries=50000,
        setup=None,
        reset=None,
        loop=None,
        connection_class=asyncpg.connection.Connection,
        record_class=asyncpg.Record,
    )
    await pool
    return pool
