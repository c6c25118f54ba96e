"""How much of a tool list the gateway reads and holds: 8 MiB and 2,000 tools a list, read as a
stream, and a per-process memory budget for what lists take once parsed (lists over 1 MiB
need one of a few permits, one per owner), so that no hostile upstream's list can exhaust the
process."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Hashable
from typing import Final

from gateway.mcp.errors import ToolListTooLarge

MiB: Final = 1024 * 1024
# A tool list, over all its pages: what is read of it at most, and how many tools it may have.
MAX_TOOL_LIST_BYTES: Final = 8 * MiB
MAX_TOOLS: Final = 2000
# What one tool list may take in memory, raw and parsed (estimated before parsing: parsed JSON
# takes 4 to 30 times its size), and what a list may take without one of the few permits.
MAX_TOOL_LIST_MEMORY: Final = 96 * MiB
FREE_TOOL_LIST_MEMORY: Final = 1 * MiB
TOOL_LIST_PERMITS: Final = 2


class ToolListMemory:
    """How much of the tool lists it reads one process holds at once.

    Each list has a hold on this (`hold(owner)`), which grows with what the list takes: its raw
    bytes as they arrive, then an estimate of each page parsed, before it is parsed. A hold up to
    `free` bytes needs nothing; beyond that it waits for one of `permits` permits, of which
    one owner (a workspace) holds at most one, so one owner's gigantic lists cannot take them all.
    No hold may grow past `limit`: that list is refused. So this process holds at most
    `permits * limit` bytes of large lists, plus `free` bytes for each list being read.
    """

    def __init__(
        self,
        *,
        permits: int = TOOL_LIST_PERMITS,
        free: int = FREE_TOOL_LIST_MEMORY,
        limit: int = MAX_TOOL_LIST_MEMORY,
    ) -> None:
        self.permits = permits
        self.free = free
        self.limit = limit
        self._holders: set[Hashable] = set()
        self._waiting: collections.deque[tuple[Hashable, asyncio.Future[None]]] = (
            collections.deque()
        )

    def hold(self, owner: Hashable) -> ToolListHold:
        """A new, empty hold for one list read for `owner`."""
        return ToolListHold(self, owner)

    @property
    def in_use(self) -> int:
        """Permits held now."""
        return len(self._holders)

    async def _acquire(self, owner: Hashable) -> None:
        # Straight in, unless someone who could be let in is waiting already.
        if self._grantable(owner) and not any(self._grantable(o) for o, _ in self._waiting):
            self._holders.add(owner)
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append((owner, waiter))
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release(owner)  # granted just as it was given up: pass it on
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiting.remove((owner, waiter))

    def _release(self, owner: Hashable) -> None:
        self._holders.discard(owner)
        # First come, first served, passing over owners that hold a permit already.
        for waiting in list(self._waiting):
            if len(self._holders) >= self.permits:
                break
            waiting_owner, waiter = waiting
            if waiter.done():
                self._waiting.remove(waiting)
            elif waiting_owner not in self._holders:
                self._holders.add(waiting_owner)
                waiter.set_result(None)
                self._waiting.remove(waiting)

    def _grantable(self, owner: Hashable) -> bool:
        return len(self._holders) < self.permits and owner not in self._holders


class ToolListHold:
    """What one tool list being read takes of a `ToolListMemory`; `release()` when done."""

    def __init__(self, memory: ToolListMemory, owner: Hashable) -> None:
        self._memory = memory
        self._owner = owner
        self.bytes = 0
        self.permitted = False

    async def grow(self, nbytes: int) -> None:
        """Take `nbytes` more, waiting for a permit if this crosses the free allowance."""
        self.bytes += nbytes
        if self.bytes > self._memory.limit:
            raise ToolListTooLarge(
                "the tool list is too large to read: it would take about "
                f"{-(-self.bytes // MiB)} MiB of memory once parsed, over the "
                f"{self._memory.limit // MiB} MiB the gateway allows one list"
            )
        if self.bytes > self._memory.free and not self.permitted:
            await self._memory._acquire(self._owner)
            self.permitted = True

    def shrink(self, nbytes: int) -> None:
        """Give back `nbytes` that are no longer held (e.g. raw bytes once parsed)."""
        self.bytes = max(0, self.bytes - nbytes)

    def release(self) -> None:
        """Give everything back (idempotent)."""
        self.bytes = 0
        if self.permitted:
            self.permitted = False
            self._memory._release(self._owner)


def parsed_size(raw: bytes | bytearray | str) -> int:
    """An upper estimate of the memory `raw` JSON takes, raw and parsed, from cheap counts.

    Measured on CPython 3.11 with orjson: an empty object takes about 72 bytes, any other
    about 190, an array 64, each member or element 8 for its slot plus up to 24 for a number,
    and each string about 50 besides its text. Counting is a few passes at memory speed (about
    10 ms for 8 MiB); typical tool lists come out at about twice their real size, the most
    compact hostile JSON (millions of tiny objects or unique keys) at about its real size.
    """
    if isinstance(raw, str):
        empty = raw.count("{}")
        objects = raw.count("{") - empty
        arrays = raw.count("[")
        members = raw.count(",") + raw.count(":")
        strings = raw.count('"') // 2
    else:
        empty = raw.count(b"{}")
        objects = raw.count(b"{") - empty
        arrays = raw.count(b"[")
        members = raw.count(b",") + raw.count(b":")
        strings = raw.count(b'"') // 2
    return len(raw) + 72 * empty + 190 * objects + 64 * arrays + 32 * members + 50 * strings
