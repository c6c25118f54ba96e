"""Waiting, boundedly, for what another task or process makes true."""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def until(condition: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
