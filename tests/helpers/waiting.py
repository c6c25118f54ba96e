"""Waiting, boundedly, for what another task or process makes true."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def until(condition: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Until an async `check` answers true (one that asks the app, e.g. through NOTIFY)."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
