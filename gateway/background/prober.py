"""The background prober: claim due servers in turns between workspaces, probe a bounded number
at a time (and a bounded number of each workspace's), store the checks."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

from gateway.db import health_checks as health_checks_db
from gateway.db import servers as servers_db
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.keys import HTTP, POOL, SETTINGS
from gateway.mcp.probe import DOWN, ProbeResult, probe
from gateway.mcp.tool_list_budget import ToolListMemory
from gateway.ops.metrics import METRICS, Metrics
from gateway.ops.tracing import PROBE_STATUS, SERVER, TRACING, WORKSPACE, Tracing, peer, set_failed
from gateway.security.credentials import upstream_auth_headers
from gateway.security.secretbox import SECRET_BOX, SecretBox
from gateway.upstreams.fingerprints import TOOL_WATCH, ToolWatch, definitions
from gateway.upstreams.tool_lists import TOOL_LIST_MEMORY

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Prober:
    pool: asyncpg.Pool
    http: aiohttp.ClientSession
    box: SecretBox
    interval: float
    timeout: float
    degraded_ms: float
    concurrency: int
    # Background probes of one workspace in flight at once in this process.
    per_workspace: int = 5
    metrics: Metrics | None = None
    # What this process may hold of tool lists at once (shared with the playground).
    memory: ToolListMemory | None = None
    # Where the tool lists probes read are fingerprinted (tool integrity).
    watch: ToolWatch | None = None
    # Each probe a span, while tracing is on (gateway/ops/tracing).
    tracing: Tracing | None = None

    @classmethod
    def from_app(cls, app: web.Application) -> Prober:
        settings = app[SETTINGS]
        return cls(
            pool=app[POOL],
            http=app[HTTP],
            box=app[SECRET_BOX],
            interval=settings.probe_interval_seconds,
            timeout=settings.probe_timeout_seconds,
            degraded_ms=settings.degraded_latency_ms,
            concurrency=settings.probe_concurrency,
            per_workspace=settings.probes_per_workspace,
            metrics=app[METRICS],
            memory=app[TOOL_LIST_MEMORY],
            watch=app[TOOL_WATCH],
            tracing=app[TRACING],
        )

    async def probe_and_record(
        self,
        server_id: uuid.UUID,
        workspace_id: uuid.UUID,
        url: str,
        auth_headers: Mapping[str, str],
    ) -> dict[str, Any] | None:
        """One probe, stored; the stored check, or None if the server was deleted meanwhile.
        Its tool list counts against the workspace's share of the process's tool list memory."""
        if self.tracing is None:
            result = await self._probe(workspace_id, url, auth_headers)
        else:
            result = await self._traced_probe(
                self.tracing, server_id, workspace_id, url, auth_headers
            )
        if self.metrics is not None:
            self.metrics.probes.inc(result.status)
            self.metrics.probe_seconds.observe(result.latency_ms / 1000, result.status)
        # The parsed list goes at once: only its definitions' text is kept.
        defined = None if result.tools is None else definitions(result.tools)
        result = replace(result, tools=None)
        check = await health_checks_db.record(self.pool, server_id, result)
        if check is not None and defined is not None and self.watch is not None:
            await self.watch.seen(server_id, defined)
        return check

    async def _probe(
        self, workspace_id: uuid.UUID, url: str, headers: Mapping[str, str]
    ) -> ProbeResult:
        return await probe(
            self.http,
            url,
            headers,
            timeout=self.timeout,
            degraded_ms=self.degraded_ms,
            memory=self.memory,
            owner=workspace_id,
        )

    async def _traced_probe(
        self,
        tracing: Tracing,
        server_id: uuid.UUID,
        workspace_id: uuid.UUID,
        url: str,
        auth_headers: Mapping[str, str],
    ) -> ProbeResult:
        """The probe as a CLIENT span of its own, its context sent with each of its requests
        (traceparent): ERROR when the server is down."""
        attributes = {SERVER: str(server_id), WORKSPACE: str(workspace_id), **peer(url)}
        headers = dict(auth_headers)
        with tracing.span("probe", attributes, headers=headers) as span:
            result = await self._probe(workspace_id, url, headers)
            span.set_attribute(PROBE_STATUS, result.status)
            if result.status == DOWN:
                set_failed(span, result.failure or "down", result.error)
        return result

    async def run_round(self) -> int:
        """Probe every server that is due now (as far as the workspaces' shares allow, which
        count while their probes run), at most `concurrency` at once; returns how many.

        Servers are claimed as slots free up rather than all at once, so with several gateway
        processes each takes a share, and every server is claimed by exactly one of them.
        """
        slots = _Slots(self.concurrency)
        claimed = 0
        try:
            while True:
                if slots.free >= self._refill_at or not slots.running:
                    claimed += await self._claim(slots)
                if not slots.running:
                    return claimed
                await slots.wait(None)
        finally:
            await slots.cancel()

    async def run_forever(self) -> None:
        """Runs until cancelled: a pipeline that claims due servers whenever slots are free,
        without waiting for the probes already running, so a workspace's hanging probes (each
        bounded by the probe timeout) hold only that workspace's share of the slots."""
        # Due times are spread by jitter, so look often; a look is one indexed query.
        tick = min(1.0, self.interval / 4)
        slots = _Slots(self.concurrency)
        last_look = -tick
        try:
            while True:
                now = time.monotonic()
                # A finished probe frees a workspace's turn: look again at once unless most
                # slots are still taken (then on the tick, so claims stay few and large).
                if slots.free and (slots.free >= self._refill_at or now - last_look >= tick):
                    last_look = now
                    try:
                        claimed = await self._claim(slots)
                        if claimed:
                            log.debug("claimed %d servers to probe", claimed)
                    except DATABASE_ERRORS as exc:
                        log.warning("prober cannot reach the database: %s", exc)
                    except Exception:
                        log.exception("claiming servers to probe failed")
                # With every slot taken only a finished probe can change anything.
                next_look = max(0.0, last_look + tick - time.monotonic())
                await slots.wait(next_look if slots.free else None)
        finally:
            await slots.cancel()

    @property
    def _refill_at(self) -> int:
        # Claiming waits for a quarter of the slots to be free: fewer, larger claims.
        return max(1, self.concurrency // 4)

    async def _claim(self, slots: _Slots) -> int:
        batch = await servers_db.claim_due(
            self.pool,
            slots.free,
            self.interval,
            per_workspace=self.per_workspace,
            in_flight=slots.by_workspace,
        )
        for row in batch:
            slots.start(row.workspace_id, self._probe_claimed(row))
        return len(batch)

    async def _probe_claimed(self, row: servers_db.UpstreamRow) -> None:
        # Failures stay with this server: the round and the other probes go on.
        try:
            credentials = None if row.credentials is None else self.box.open(row.credentials)
        except ValueError as exc:
            log.error("cannot probe server %s: %s", row.id, exc, extra={"server_id": str(row.id)})
            return
        try:
            await self.probe_and_record(
                row.id, row.workspace_id, row.url, upstream_auth_headers(row.auth_type, credentials)
            )
        except DATABASE_ERRORS as exc:
            log.warning(
                "could not store the probe of server %s: %s",
                row.id,
                exc,
                extra={"server_id": str(row.id)},
            )
        except Exception:
            log.exception("probing server %s failed", row.id, extra={"server_id": str(row.id)})


class _Slots:
    """The probes this process has in flight, and how many of them are each workspace's."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.running: dict[asyncio.Task[None], uuid.UUID] = {}
        self.by_workspace: Counter[uuid.UUID] = Counter()

    @property
    def free(self) -> int:
        return self.size - len(self.running)

    def start(self, workspace_id: uuid.UUID, probe: Coroutine[Any, Any, None]) -> None:
        self.running[asyncio.create_task(probe)] = workspace_id
        self.by_workspace[workspace_id] += 1

    async def wait(self, timeout: float | None) -> None:  # noqa: ASYNC109 -- a wait, not a bound
        """Until a probe ends (or `timeout` passes), then frees the slots of those that ended."""
        if not self.running:
            if timeout is not None:
                await asyncio.sleep(timeout)
            return
        done, _ = await asyncio.wait(
            self.running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        for task in done:
            workspace_id = self.running.pop(task)
            self.by_workspace[workspace_id] -= 1
            if not self.by_workspace[workspace_id]:
                del self.by_workspace[workspace_id]

    async def cancel(self) -> None:
        for task in self.running:
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)
        self.running.clear()
        self.by_workspace.clear()


async def run(app: web.Application) -> None:
    """The loop as the app starts it."""
    await Prober.from_app(app).run_forever()
