"""SQL for rate limits' budgets when no Redis is configured: one row per limit and window,
counting the calls that processes have taken leases on (gateway/policy/budgets.py).

UNLOGGED: no WAL for counters rewritten all day; a crash of PostgreSQL empties the table,
which only starts the current windows afresh.
"""

from __future__ import annotations

from gateway.db.types import Executor

# Takes up to $3 calls of the window's budget of $4, as many as are left. Every SET expression
# reads the row as it was, so `granted` is what this statement added; the row lock serialises
# processes racing for the last calls.
_TAKE = """
INSERT INTO call_budgets AS b (subject, window_start, used, granted, expires_at)
VALUES ($1, to_timestamp($2::float8), LEAST($3::int, $4::int), LEAST($3::int, $4::int),
        to_timestamp($5::float8))
ON CONFLICT (subject, window_start) DO UPDATE
SET granted = LEAST($3::int, GREATEST($4::int - b.used, 0)),
    used = b.used + LEAST($3::int, GREATEST($4::int - b.used, 0))
RETURNING granted
"""

_REFUND = """
UPDATE call_budgets SET used = GREATEST(used - $3::int, 0)
WHERE subject = $1 AND window_start = to_timestamp($2::float8)
"""

_PRUNE = "DELETE FROM call_budgets WHERE expires_at < now()"


async def take(
    db: Executor, subject: str, window_start: float, want: int, limit: int, expires_at: float
) -> int:
    """How many of `want` calls the window still had for this process (0 when none)."""
    granted: int = await db.fetchval(_TAKE, subject, window_start, want, limit, expires_at)
    return granted


async def refund(db: Executor, subject: str, window_start: float, amount: int) -> None:
    await db.execute(_REFUND, subject, window_start, amount)


async def prune(db: Executor) -> None:
    """Drop the rows of windows that have ended."""
    await db.execute(_PRUNE)
