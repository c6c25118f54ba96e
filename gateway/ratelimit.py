"""Rate limiting of login and signup attempts, per client address and per email.

The counts are shared by every gateway process, so N processes (or machines) behind a balancer
still allow the configured rate, not N times it: kept in Redis when REDIS_URL is set, else in
PostgreSQL (gateway/db/rate_limits.py). A moving window either way, through limits'
MovingWindowSupport interface (its MovingWindowRateLimiter only admits limits' own storages,
and is these two calls).
"""

from __future__ import annotations

import logging
import math
import time

import asyncpg
from limits import parse
from limits.aio.storage import MovingWindowSupport, RedisStorage
from redis.exceptions import RedisError

from gateway.db.rate_limits import PostgresMovingWindow
from gateway.errors import TooManyRequests

log = logging.getLogger(__name__)


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
