"""The asyncpg connection pool."""

from __future__ import annotations

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


async def create_pool(dsn: str, *, min_size: int = 2, max_size: int = 20) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        # Connections that lived through a PostgreSQL restart are dropped and replaced.
        max_inactive_connection_lifetime=60,
    )
    assert pool is not None
    return pool
