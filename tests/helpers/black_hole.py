"""A hostile peer for fairness tests: an HTTP server on 127.0.0.1 that accepts every request and
never answers, noting when each arrived."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from tests.helpers.upstreams import serve_loopback


@dataclass
class BlackHole:
    """Holds every request until its client gives up and closes the connection."""

    base_url: str = ""
    arrivals: list[float] = field(default_factory=list)

    def url(self, path: str = "/mcp") -> str:
        return f"{self.base_url}{path}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.arrivals.append(time.monotonic())
        # Polled: aiohttp does not cancel a handler whose client went away.
        for _ in itertools.count():
            if request.transport is None or request.transport.is_closing():
                break
            await asyncio.sleep(0.05)
        return web.Response(status=504)  # to nobody: the client has gone

    def most_within(self, seconds: float) -> int:
        """The most requests that arrived within `seconds` of each other. When the client holds
        each request for longer than that (its timeout), that many were in flight together."""
        times = sorted(self.arrivals)
        return max(
            (bisect.bisect_left(times, start + seconds) - i for i, start in enumerate(times)),
            default=0,
        )


@contextlib.asynccontextmanager
async def black_hole() -> AsyncIterator[BlackHole]:
    """A `BlackHole` on a free loopback port, answering (never) on every path."""
    hole = BlackHole()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hole.handle)
    async with serve_loopback(app) as base_url:
        hole.base_url = base_url
        yield hole
