"""Rate limiting of login and signup attempts, per client address and per email."""

from __future__ import annotations

import math
import time

from limits import parse
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter

from gateway.errors import TooManyRequests


class AuthRateLimiter:
    """Counts every attempt; the limit applies separately to each address and each email.

    Counters are per process: with N processes behind a balancer the effective limit is N
    times higher, which is still enough to stop online password guessing.
    """

    def __init__(self, rate: str) -> None:
        self._item = parse(rate)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    async def hit(self, *keys: str) -> None:
        for key in keys:
            if not await self._limiter.hit(self._item, "auth", key):
                stats = await self._limiter.get_window_stats(self._item, "auth", key)
                retry_after = max(1, math.ceil(stats.reset_time - time.time()))
                raise TooManyRequests(
                    f"too many attempts, retry in {retry_after} s", retry_after=retry_after
                )
