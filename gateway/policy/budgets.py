"""Rate limits that hold across every process and machine, with no round trip per call.

A limit ("100/minute") gives each fixed window (aligned on the epoch) a *budget* of calls, kept
in one place every process sees: Redis when REDIS_URL is set, else PostgreSQL. A process does
not ask that store for each call; it takes a *lease* of part of the budget (a twentieth of the
limit, at least the calls at hand) and counts calls against it in memory. A lease unused for a
second goes back to the budget, so another process can spend it.

Taking a lease never over-spends the budget (the store grants at most what is left), so a
deployment never admits more than the limit. It may admit a little less: what processes
hold in leases when the budget runs out, at most a twentieth of the limit each and at worst
for a second. Two processes stay within 10 % of the limit.

While the store is away, each process counts the whole limit alone, and says so in the log:
a deployment of N processes then admits at most N times the limit. Neither unlimited (a
runaway agent is what limits are for) nor refusing everything (the proxy keeps serving while
the database is away, and so do its limits).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import Final, Protocol

import asyncpg
from aiohttp import web
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.db import call_budgets
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.policy.rules import RateLimit

log = logging.getLogger(__name__)

# A lease is this share of the limit (at least one call): the bound on what sits unspent in
# one process when the budget runs out, and on the round trips a window costs.
LEASE_SHARE: Final = 20
MAX_LEASE: Final = 1000
# A lease unused this long goes back to the budget.
IDLE_SECONDS: Final = 1.0
# When the store says the budget is spent, calls are refused locally for this long before
# asking again (a process that refunded may have made room).
EMPTY_SECONDS: Final = 0.5
_WARN_EVERY_SECONDS: Final = 60.0
# What a store raises when it is away (or reports an error).
_STORE_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, RedisError, OSError)


class BudgetStore(Protocol):
    async def take(
        self, subject: str, window_start: float, want: int, limit: int, expires_at: float
    ) -> int:
        """Up to `want` calls of the window's budget of `limit`; how many were granted."""

    async def refund(self, subject: str, window_start: float, amount: int) -> None: ...

    async def prune(self) -> None:
        """Forget windows that have ended (a no-op where entries expire by themselves)."""


class PostgresBudgets:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def take(
        self, subject: str, window_start: float, want: int, limit: int, expires_at: float
    ) -> int:
        return await call_budgets.take(self._pool, subject, window_start, want, limit, expires_at)

    async def refund(self, subject: str, window_start: float, amount: int) -> None:
        await call_budgets.refund(self._pool, subject, window_start, amount)

    async def prune(self) -> None:
        await call_budgets.prune(self._pool)


# KEYS[1]: the window's counter. ARGV: want, limit, seconds to keep it.
_TAKE_SCRIPT = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local granted = math.min(tonumber(ARGV[1]), math.max(tonumber(ARGV[2]) - used, 0))
if granted > 0 then
  redis.call('INCRBY', KEYS[1], granted)
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
return granted
"""


# Only into a counter that is still there: DECRBY on an expired one would create a key that
# never expires.
_REFUND_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('DECRBY', KEYS[1], ARGV[1])
end
return 0
"""


class RedisBudgets:
    def __init__(self, redis_url: str) -> None:
        self._redis = Redis.from_url(redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._take = self._redis.register_script(_TAKE_SCRIPT)
        self._refund = self._redis.register_script(_REFUND_SCRIPT)

    @staticmethod
    def _key(subject: str, window_start: float) -> str:
        return f"mcp-gateway:budget:{subject}:{int(window_start)}"

    async def take(
        self, subject: str, window_start: float, want: int, limit: int, expires_at: float
    ) -> int:
        keep = max(1, math.ceil(expires_at - time.time()))
        key = self._key(subject, window_start)
        return int(await self._take(keys=[key], args=[want, limit, keep]))

    async def refund(self, subject: str, window_start: float, amount: int) -> None:
        await self._refund(keys=[self._key(subject, window_start)], args=[amount])

    async def prune(self) -> None:
        pass  # every counter expires with its window

    async def close(self) -> None:
        await self._redis.aclose()


class _Lease:
    """This process's part of one limit's budget for the current window."""

    __slots__ = ("empty_until", "last_used", "left", "taking", "window_end", "window_start")

    def __init__(self, window_start: float, window_end: float) -> None:
        self.window_start = window_start
        self.window_end = window_end
        self.left = 0
        self.last_used = 0.0
        self.empty_until = 0.0
        # The round trip in progress that fills it: concurrent calls wait for the same one.
        self.taking: asyncio.Future[None] | None = None


class Budgets:
    """Takes calls from limits' budgets: `await take(...)` is 0.0 when the calls may go ahead,
    else the seconds until the limit's window ends (Retry-After)."""

    def __init__(self, store: BudgetStore) -> None:
        self._store = store
        self._leases: dict[str, _Lease] = {}
        # While the store is away: calls counted here alone, per (subject, window start).
        self._alone: dict[tuple[str, float], int] = {}
        self._warned_at = -math.inf

    async def take(self, subject: str, limit: RateLimit, calls: int = 1) -> float:
        now = time.time()
        lease = self._lease(subject, limit, now)
        while lease.left < calls:
            if now < lease.empty_until:
                return _retry_after(lease, now)
            if lease.taking is None:
                await self._fill(subject, limit, lease, calls)
                if lease.left < calls:
                    lease.empty_until = min(lease.window_end, time.time() + EMPTY_SECONDS)
                    return _retry_after(lease, time.time())
            else:
                await asyncio.shield(lease.taking)
            now = time.time()
            if lease is not self._lease(subject, limit, now):
                lease = self._lease(subject, limit, now)  # a new window began meanwhile
        lease.left -= calls
        lease.last_used = now
        return 0.0

    def give_back(self, subject: str, limit: RateLimit, calls: int = 1) -> None:
        """Calls taken and then not made (another limit refused them): back into the lease."""
        lease = self._leases.get(subject)
        if lease is not None and lease.window_end > time.time():
            lease.left += calls

    def _lease(self, subject: str, limit: RateLimit, now: float) -> _Lease:
        lease = self._leases.get(subject)
        if lease is None or now >= lease.window_end:
            start = now - now % limit.seconds
            lease = self._leases[subject] = _Lease(start, start + limit.seconds)
        return lease

    async def _fill(self, subject: str, limit: RateLimit, lease: _Lease, calls: int) -> None:
        want = max(calls - lease.left, min(MAX_LEASE, max(1, limit.amount // LEASE_SHARE)))
        lease.taking = asyncio.get_running_loop().create_future()
        try:
            granted = await self._store.take(
                subject, lease.window_start, want, limit.amount, lease.window_end + 60
            )
        except _STORE_ERRORS as exc:
            granted = self._take_alone(subject, lease, want, limit, exc)
        finally:
            lease.taking.set_result(None)
            lease.taking = None
        lease.left += granted

    def _take_alone(
        self, subject: str, lease: _Lease, want: int, limit: RateLimit, exc: BaseException
    ) -> int:
        now = time.monotonic()
        if now - self._warned_at > _WARN_EVERY_SECONDS:
            self._warned_at = now
            log.warning(
                "rate limit budgets unavailable (%s): each process counts its limits alone "
                "until they are back",
                exc,
            )
        key = (subject, lease.window_start)
        used = self._alone.get(key, 0)
        granted = min(want, max(limit.amount - used, 0))
        self._alone[key] = used + granted
        return granted

    async def refund_idle(self) -> None:
        """Give unused leases back to their budgets, and forget windows that have ended."""
        now = time.time()
        for subject, lease in list(self._leases.items()):
            if now >= lease.window_end:
                del self._leases[subject]
            elif lease.left and lease.taking is None and now - lease.last_used > IDLE_SECONDS:
                amount, lease.left = lease.left, 0
                try:
                    await self._store.refund(subject, lease.window_start, amount)
                except _STORE_ERRORS as exc:
                    log.debug("a lease could not be refunded: %s", exc)
        for key in [k for k in self._alone if k[1] + 86400 < now]:
            del self._alone[key]

    async def refund_all(self) -> None:
        """On shutdown: every lease back, so the other processes may spend it."""
        for lease in self._leases.values():
            lease.last_used = 0.0
        await self.refund_idle()


def _retry_after(lease: _Lease, now: float) -> float:
    return max(1.0, math.ceil(lease.window_end - now))


async def run_refunds(budgets: Budgets, store: BudgetStore) -> None:
    """Every process's own loop (every process takes leases): idle leases back each second,
    ended windows pruned each minute."""
    pruned_at = time.monotonic()
    while True:
        await asyncio.sleep(IDLE_SECONDS / 2)
        await budgets.refund_idle()
        if time.monotonic() - pruned_at > 60:
            pruned_at = time.monotonic()
            with contextlib.suppress(*_STORE_ERRORS):
                await store.prune()


@contextlib.asynccontextmanager
async def budgets_for(pool: asyncpg.Pool, redis_url: str | None) -> AsyncIterator[Budgets]:
    """The process's Budgets, its refund loop running, every lease refunded when it ends."""
    store: PostgresBudgets | RedisBudgets = (
        PostgresBudgets(pool) if redis_url is None else RedisBudgets(redis_url)
    )
    budgets = Budgets(store)
    loop = asyncio.create_task(run_refunds(budgets, store), name="budget refunds")
    try:
        yield budgets
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
        with contextlib.suppress(*_STORE_ERRORS):
            await budgets.refund_all()
        if isinstance(store, RedisBudgets):
            await store.close()


# The process's rate limit budgets (made in app.py's cleanup contexts).
BUDGETS: web.AppKey[Budgets] = web.AppKey("budgets", Budgets)
