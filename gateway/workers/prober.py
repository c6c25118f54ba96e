"""The background prober: claim due servers, probe a bounded number at a time, store the checks."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

from gateway.db import health_checks as health_checks_db
from gateway.db import servers as servers_db
from gateway.keys import HTTP, METRICS, POOL, SECRET_BOX, SETTINGS
from gateway.mcp.probe import probe
from gateway.metrics import Metrics
from gateway.security.credentials import upstream_auth_headers
from gateway.security.secretbox import SecretBox

log = logging.getLogger(__name__)

# What a lost database connection looks like; the loop waits and tries again.
_DATABASE_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)


@dataclass(frozen=True, slots=True)
class Prober:
    pool: asyncpg.Pool
    http: aiohttp.ClientSession
    box: SecretBox
    interval: float
    timeout: float
    degraded_ms: float
    concurrency: int
    metrics: Metrics | None = None

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
            metrics=app[METRICS],
        )

    async def probe_and_record(
        self, server_id: uuid.UUID, url: str, auth_headers: Mapping[str, str]
    ) -> dict[str, Any] | None:
        """One probe, stored; the stored check, or None if the server was deleted meanwhile."""
        result = await probe(
            self.http, url, auth_headers, timeout=self.timeout, degraded_ms=self.degraded_ms
        )
        if self.metrics is not None:
            self.metrics.probes.inc(result.status)
            self.metrics.probe_seconds.observe(result.latency_ms / 1000, result.status)
        return await health_checks_db.record(self.pool, server_id, result)

    async def run_round(self) -> int:
        """Probe every server that is due now, at most `concurrency` at once; returns how many.

        Servers are claimed as slots free up rather than all at once, so with several gateway
        processes each takes a share, and every server is claimed by exactly one of them.
        """
        in_flight: set[asyncio.Task[None]] = set()
        claimed = 0
        more = True
        # Claiming waits for a quarter of the slots to be free: fewer, larger claims.
        refill_at = max(1, self.concurrency // 4)
        try:
            while more or in_flight:
                free = self.concurrency - len(in_flight)
                if more and (free >= refill_at or not in_flight):
                    batch = await servers_db.claim_due(self.pool, free, self.interval)
                    more = len(batch) == free
                    claimed += len(batch)
                    for row in batch:
                        in_flight.add(asyncio.create_task(self._probe_claimed(row)))
                if in_flight:
                    _, in_flight = await asyncio.wait(
                        in_flight, return_when=asyncio.FIRST_COMPLETED
                    )
        finally:
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
        return claimed

    async def _probe_claimed(self, row: servers_db.UpstreamRow) -> None:
        # Failures stay with this server: the round and the other probes go on.
        try:
            credentials = None if row.credentials is None else self.box.open(row.credentials)
        except ValueError as exc:
            log.error("cannot probe server %s: %s", row.id, exc, extra={"server_id": str(row.id)})
            return
        try:
            await self.probe_and_record(
                row.id, row.url, upstream_auth_headers(row.auth_type, credentials)
            )
        except _DATABASE_ERRORS as exc:
            log.warning(
                "could not store the probe of server %s: %s",
                row.id,
                exc,
                extra={"server_id": str(row.id)},
            )
        except Exception:
            log.exception("probing server %s failed", row.id, extra={"server_id": str(row.id)})

    async def run_forever(self) -> None:
        # Due times are spread by jitter, so look often; a look is one indexed query.
        tick = min(1.0, self.interval / 4)
        while True:
            try:
                probed = await self.run_round()
                if probed:
                    log.debug("probed %d servers", probed)
            except _DATABASE_ERRORS as exc:
                log.warning("prober cannot reach the database: %s", exc)
            except Exception:
                log.exception("probe round failed")
            await asyncio.sleep(tick)
