"""SQL for the rate limits shared by every gateway process: a moving window per key.

The storage behind limits' MovingWindowRateLimiter when no Redis is configured (limits has no
PostgreSQL storage): each attempt is a row of rate_limit_hits, alive for the window. An attempt
is taken under a transaction-scoped advisory lock on its key, so processes racing for the last
slot of a window cannot both get it.
"""

from __future__ import annotations

import time

import asyncpg
from limits.aio.storage import MovingWindowSupport

from gateway.db.unavailable import DATABASE_ERRORS

# The two-key advisory lock space (separate from the one-key space of migrations and
# partitions): this constant, and the key's hash.
_LOCK_CLASS = 0x726C

_LOCK = "SELECT pg_advisory_xact_lock($1, hashtext($2))"

# Counts the key's attempts in the window and adds `amount` more if they fit; the key's
# expired rows go on the way.
_ACQUIRE = """
WITH expired AS (
    DELETE FROM rate_limit_hits WHERE key = $1 AND expires_at <= clock_timestamp()
), taken AS (
    SELECT count(*) AS n FROM rate_limit_hits
    WHERE key = $1 AND at > clock_timestamp() - make_interval(secs => $3)
), added AS (
    INSERT INTO rate_limit_hits (key, at, expires_at)
    SELECT $1, clock_timestamp(), clock_timestamp() + make_interval(secs => $3)
    FROM generate_series(1, $4)
    WHERE (SELECT n FROM taken) + $4 <= $2
    RETURNING 1
)
SELECT count(*) > 0 FROM added
"""

# The oldest of the newest `limit` attempts in the window (when the window frees a slot), and
# how many there are.
_WINDOW = """
SELECT extract(epoch FROM min(at))::float8 AS start, count(*)::int AS n FROM (
    SELECT at FROM rate_limit_hits
    WHERE key = $1 AND at > clock_timestamp() - make_interval(secs => $2)
    ORDER BY at DESC LIMIT $3
) AS recent
"""

# Rows of keys nobody tried again (the retention loop's sweep), a batch at a time.
_PRUNE = """
DELETE FROM rate_limit_hits WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM rate_limit_hits WHERE expires_at <= now() LIMIT $1
))
"""


class PostgresMovingWindow(MovingWindowSupport):
    """limits' moving-window storage interface, on the gateway's PostgreSQL."""

    # What limits' wrapper of these methods looks for; raised as they are (the error
    # middleware makes a database that is away a 503).
    base_exceptions = DATABASE_ERRORS
    wrap_exceptions = False

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        if amount > limit:
            return False
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(_LOCK, _LOCK_CLASS, key)
            acquired: bool = await conn.fetchval(_ACQUIRE, key, limit, float(expiry), amount)
            return acquired

    async def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        row = await self._pool.fetchrow(_WINDOW, key, float(expiry), limit)
        assert row is not None
        if not row["n"]:
            return time.time(), 0
        return row["start"], row["n"]


async def prune(pool: asyncpg.Pool, batch_size: int) -> int:
    """Deletes up to `batch_size` attempts whose window has passed; returns how many."""
    status: str = await pool.execute(_PRUNE, batch_size)
    return int(status.rsplit(" ", 1)[1])
