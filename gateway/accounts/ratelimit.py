"""Rate limiting of login and signup attempts, per client address and per email.

The counts are shared by every gateway process, so N processes (or machines) behind a balancer
still allow the configured rate, not N times it: kept in Redis when REDIS_URL is set, else in
PostgreSQL (gateway/db/rate_limits.py). A moving window either way, through limits'
MovingWindowSupport interface (its MovingWindowRateLimiter only admits limits' own storages,
and is these two calls).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time

import asyncpg
from aiohttp import web
from limits import parse
from limits.aio.storage import MovingWindowSupport, RedisStorage
from redis.exceptions import RedisError

from gateway.db.rate_limits import PostgresMovingWindow
from gateway.errors import TooManyRequests
from gateway.security.outbound import Network

log = logging.getLogger(__name__)

# Longer than any address; a longer X-Forwarded-For entry is not one (and is cut to this).
_MAX_ADDRESS = 64


def client_address(request: web.Request, trusted: tuple[Network, ...]) -> str:
    """The address to count a login attempt against. Behind a proxy in `trusted`
    (GATEWAY_TRUSTED_PROXIES), the nearest address in X-Forwarded-For that is not a trusted
    proxy: entries further left were written by the client and prove nothing."""
    peer = request.remote or "unknown"
    if not trusted or not _within(peer, trusted):
        return peer
    hops = [h.strip() for v in request.headers.getall("X-Forwarded-For", ()) for h in v.split(",")]
    hops = [h for h in hops if h]
    for hop in reversed(hops):
        if not _within(hop, trusted):
            return hop[:_MAX_ADDRESS]
    return hops[0][:_MAX_ADDRESS] if hops else peer


def _within(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


class AuthRateLimiter:
    """Counts every attempt; the limit applies separately to each address and each email."""

    def __init__(self, rate: str, storage: MovingWindowSupport) -> None:
        self._item = parse(rate)
        self._storage = storage
        self._in_redis = isinstance(storage, RedisStorage)

    @classmethod
    def shared(cls, rate: str, pool: asyncpg.Pool, redis_url: str | None) -> AuthRateLimiter:
        if redis_url is None:
            return cls(rate, PostgresMovingWindow(pool))
        # limits wants "async+" in front; redis-py is the client aiocache already brings.
        return cls(rate, RedisStorage(f"async+{redis_url}", implementation="redispy"))

    async def hit(self, *keys: str) -> None:
        try:
            item, storage = self._item, self._storage
            for key in keys:
                window_key = item.key_for("auth", key)
                expiry = item.get_expiry()
                if not await storage.acquire_entry(window_key, item.amount, expiry):
                    start, _ = await storage.get_moving_window(window_key, item.amount, expiry)
                    retry_after = max(1, math.ceil(start + expiry - time.time()))
                    raise TooManyRequests(
                        f"too many attempts, retry in {retry_after} s", retry_after=retry_after
                    )
        except (RedisError, OSError) as exc:
            if not self._in_redis:
                raise
            # Redis is a cache here: while it is away, logins go on unlimited (and logged)
            # rather than nobody logging in at all.
            log.warning("rate limit storage unavailable, attempt let through: %s", exc)

    async def exhausted(self, key: str) -> int | None:
        """Seconds until `key` may try again when its window is full, else None; counts
        nothing (for limits on failures only: checked first, hit() after a failure)."""
        try:
            item = self._item
            expiry = item.get_expiry()
            start, count = await self._storage.get_moving_window(
                item.key_for("auth", key), item.amount, expiry
            )
        except (RedisError, OSError) as exc:
            if not self._in_redis:
                raise
            log.warning("rate limit storage unavailable, attempt let through: %s", exc)
            return None
        if count < item.amount:
            return None
        return max(1, math.ceil(start + expiry - time.time()))


# Login and signup attempts, per client address and per email.
RATE_LIMITER: web.AppKey[AuthRateLimiter] = web.AppKey("auth_rate_limiter")
# Verification emails per address (gateway.accounts.signup), shared by every process likewise.
EMAIL_RATE_LIMITER: web.AppKey[AuthRateLimiter] = web.AppKey("email_rate_limiter")
