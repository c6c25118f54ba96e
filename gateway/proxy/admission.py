"""Which proxied requests are let in: a workspace's (and the process's) requests in flight are
bounded, and large bodies are read one at a time, so no tenant takes the others' share of the
process's descriptors or of its event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
import uuid
from collections.abc import Iterator
from typing import NoReturn

from gateway.errors import (
    TooManyRequests,
)
from gateway.proxy.requests import ToolCallSeen, tool_calls_in

log = logging.getLogger(__name__)


class InFlight:
    """Proxied requests in flight in this process, by workspace: admitted while the workspace
    holds fewer than `per_workspace` and the process fewer than `total`. The proxy counts in
    each workspace's slot (a one-item list) in place: one dictionary lookup per request."""

    __slots__ = ("by_workspace", "count", "per_workspace", "total")

    def __init__(self, per_workspace: int, total: int) -> None:
        self.by_workspace: dict[uuid.UUID, list[int]] = {}
        self.per_workspace = per_workspace
        self.total = total
        self.count = 0

    def slot(self, workspace_id: uuid.UUID) -> list[int]:
        """A new slot for the workspace (idle ones are dropped now and then)."""
        if len(self.by_workspace) >= _SLOTS_KEPT:
            idle = [key for key, slot in self.by_workspace.items() if not slot[0]]
            for key in idle:
                del self.by_workspace[key]
        slot = self.by_workspace[workspace_id] = [0]
        return slot

    @contextlib.contextmanager
    def holding(self, workspace_id: uuid.UUID) -> Iterator[None]:
        """Count a request of the workspace that holds an upstream connection outside the
        proxy (the playground, an on-demand probe) for as long as the block runs."""
        slot = self.by_workspace.get(workspace_id) or self.slot(workspace_id)
        if slot[0] >= self.per_workspace or self.count >= self.total:
            self.refuse(slot[0])
        slot[0] += 1
        self.count += 1
        try:
            yield
        finally:
            slot[0] -= 1
            self.count -= 1

    def refuse(self, held: int) -> NoReturn:
        """429: the workspace (holding `held`), or the whole process, is at its bound."""
        if held >= self.per_workspace:
            raise TooManyRequests(
                f"this workspace already has {held} proxied requests in flight in this gateway "
                f"process (GATEWAY_MAX_STREAMS_PER_WORKSPACE); close some streams or retry",
                retry_after=1,
            )
        raise TooManyRequests(
            "this gateway process is at its bound of proxied requests in flight; retry",
            retry_after=1,
        )


# Workspaces with a slot before idle ones are dropped.
_SLOTS_KEPT = 10_000

# Bodies larger than this are read one at a time in the process, one per workspace (a body of
# many small arrays or objects holds the event loop while it is parsed: up to MAX_CONTAINERS
# of them, tens of milliseconds), each after the others' requests had their turn.
LARGE_BODY_BYTES = 64 * 1024


class LargeBodies:
    """Reads large request bodies (tool_calls_in) in turn: one at a time in the process and
    per workspace, each followed by as long for everything else, so one tenant's stream of
    them slows the others' requests by at most one body's reading at a time."""

    def __init__(self) -> None:
        self._turn = asyncio.Lock()
        self._waiting: dict[uuid.UUID, asyncio.Lock] = {}

    async def read(self, workspace_id: uuid.UUID, body: bytes) -> list[ToolCallSeen]:
        lock = self._waiting.get(workspace_id)
        if lock is None:
            lock = self._waiting[workspace_id] = asyncio.Lock()
        try:
            async with lock, self._turn:
                started = time.perf_counter()
                try:
                    return tool_calls_in(body)
                finally:
                    # Everything else gets as long again before the next large body: at most
                    # half of the event loop's time goes to reading them.
                    await asyncio.sleep(time.perf_counter() - started)
        finally:
            if not lock.locked() and self._waiting.get(workspace_id) is lock:
                del self._waiting[workspace_id]


# Descriptors kept for everything but proxied requests (logins, the API, the database pool,
# probes and webhooks), out of the process's limit.
_RESERVED_DESCRIPTORS = 1024


def process_stream_bound() -> int:
    """How many proxied requests this process can hold open at once: two descriptors each
    (the caller's connection and the upstream's), leaving _RESERVED_DESCRIPTORS for the rest.
    The soft limit is raised to the hard one first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            log.info("cannot raise the open file limit from %d", soft)
    return max(64, (soft - _RESERVED_DESCRIPTORS) // 2)
