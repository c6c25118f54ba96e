"""What a gateway process reads off its parts for the metrics (call log, pool, caches), and the
snapshots workers share: under `serve --workers N` each writes its figures every
SNAPSHOT_SECONDS into a directory the parent made, so whichever worker takes a scrape answers
for all."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gateway.caching.caches import CACHES
from gateway.calllog.writer import CALL_LOG, CallLog
from gateway.keys import POOL, SETTINGS
from gateway.ops.metrics import METRICS, Labels, Metrics, Reading, Series, dump, families, load
from gateway.upstreams.tool_lists import TOOL_LISTS

log = logging.getLogger(__name__)

SNAPSHOT_SECONDS = 2.0


def _call_log_readings(call_log: CallLog) -> list[Reading]:
    stats = call_log.stats

    def counter(name: str, documentation: str, attribute: str) -> Reading:
        return Reading(
            "counter", name, documentation, (), lambda: [((), getattr(stats, attribute))]
        )

    return [
        counter("tool_calls_written", "Tool calls stored", "written"),
        counter(
            "tool_calls_skipped",
            "Tool calls not stored: their server was deleted first, or already stored",
            "skipped",
        ),
        counter(
            "tool_calls_dropped",
            "Tool calls lost: the queue was full, or shutdown gave up on the database",
            "dropped",
        ),
        counter(
            "tool_calls_rejected",
            "Tool calls set aside: PostgreSQL refused them even on their own (bad data)",
            "rejected",
        ),
        counter("call_log_batches", "Batches committed", "batches"),
        counter("call_log_failures", "Batch attempts that failed (and were retried)", "failures"),
        Reading(
            "gauge",
            "call_log_pending",
            "Tool calls in memory, not yet stored",
            (),
            lambda: [((), len(call_log))],
        ),
    ]


def _pool_reading(app: web.Application) -> Reading:
    def read() -> Iterable[tuple[Labels, float]]:
        pool = app[POOL]
        size, idle = pool.get_size(), pool.get_idle_size()
        return [(("max",), pool.get_max_size()), (("open",), size), (("in_use",), size - idle)]

    return Reading(
        "gauge", "db_pool_connections", "PostgreSQL connections of the pool", ("state",), read
    )


def _cache_reading(app: web.Application) -> Reading:
    """The caches that count for themselves (hot paths: a bare addition), beside the ones that
    count in Metrics.cache_requests: one metric family."""

    def read() -> Iterable[tuple[Labels, float]]:
        counted: list[tuple[str, Any]] = [(c.name, c) for c in app[CACHES].counted()]
        tool_lists = app.get(TOOL_LISTS)  # made after the first snapshot may be taken
        if tool_lists is not None:
            counted.append(("tool_lists", tool_lists))
        for name, cache in counted:
            yield (name, "hit"), cache.hits
            yield (name, "miss"), cache.misses

    metric = app[METRICS].cache_requests
    return Reading("counter", metric.name, metric.documentation, metric.labelnames, read)


class _Scrape(Collector):
    def __init__(self, snapshots: list[tuple[int, list[Series]]]) -> None:
        self._snapshots = snapshots

    def collect(self) -> Iterator[Metric]:
        return families(self._snapshots)


def _others(folder: Path | None, me: int) -> list[tuple[int, list[Series]]]:
    found: list[tuple[int, list[Series]]] = []
    if folder is None:
        return found
    for path in sorted(folder.glob("worker-*.json")):
        worker = int(path.stem.removeprefix("worker-"))
        if worker == me:
            continue
        with contextlib.suppress(OSError, ValueError):  # one being replaced right now
            found.append((worker, load(path.read_bytes())))
    return found


async def metrics_context(app: web.Application) -> AsyncIterator[None]:
    """After the pool and the call log: their readings join; under several workers, the
    snapshot writer runs until shutdown (its file is removed then)."""
    metrics = app[METRICS]
    metrics.readings.extend(
        [*_call_log_readings(app[CALL_LOG]), _pool_reading(app), _cache_reading(app)]
    )
    settings = app[SETTINGS]
    if settings.metrics_dir is None:
        yield
        return
    path = settings.metrics_dir / f"worker-{settings.worker_id}.json"
    task = asyncio.create_task(_write_snapshots(metrics, path))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    with contextlib.suppress(OSError):
        path.unlink()


async def _write_snapshots(metrics: Metrics, path: Path) -> None:
    partial = path.with_suffix(".partial")
    while True:
        try:
            partial.write_bytes(dump(metrics.series()))
            os.replace(partial, path)  # readers see the old file or the new one, whole
        except Exception:  # the next round may succeed; the task must not end
            log.exception("cannot write the metrics snapshot %s", path)
        await asyncio.sleep(SNAPSHOT_SECONDS)


def scrape(app: web.Application) -> bytes:
    """Every worker's figures in the Prometheus text format: this one's live, the others'
    from their latest snapshots."""
    settings = app[SETTINGS]
    me = settings.worker_id
    snapshots = [(me, app[METRICS].series()), *_others(settings.metrics_dir, me)]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape(snapshots))
    return generate_latest(registry)
