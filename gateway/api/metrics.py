"""/metrics: this process's call log counters, in the Prometheus text format.

Public, like a scrape target usually is: the figures are process-wide counts, never a
tenant's data. Each gateway process answers for itself (scrape every process).
"""

from __future__ import annotations

from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.api.routing import Routes
from gateway.auth import PUBLIC
from gateway.calllog import CallLog
from gateway.keys import CALL_LOG

routes = Routes("metrics")


class CallLogCollector(Collector):
    """Reads CallLog.stats at scrape time."""

    def __init__(self, call_log: CallLog) -> None:
        self._log = call_log

    def collect(self) -> Iterator[Metric]:
        stats = self._log.stats
        counters = (
            ("tool_calls_written", "Tool calls stored", stats.written),
            (
                "tool_calls_skipped",
                "Tool calls not stored: their server was deleted first, or already stored",
                stats.skipped,
            ),
            (
                "tool_calls_dropped",
                "Tool calls lost: the queue was full, or shutdown gave up on the database",
                stats.dropped,
            ),
            (
                "tool_calls_rejected",
                "Tool calls set aside: PostgreSQL refused them even on their own (bad data)",
                stats.rejected,
            ),
            ("call_log_batches", "Batches committed", stats.batches),
            ("call_log_failures", "Batch attempts that failed (and were retried)", stats.failures),
        )
        for name, documentation, value in counters:
            yield CounterMetricFamily(f"mcp_gateway_{name}", documentation, value=value)
        yield GaugeMetricFamily(
            "mcp_gateway_call_log_pending",
            "Tool calls in memory, not yet stored",
            value=len(self._log),
        )


@routes.get(
    "/metrics",
    summary="Call log counters of this process (Prometheus text format)",
    access=PUBLIC,
    response=str,
    media_type="text/plain",
)
async def metrics(request: web.Request) -> web.Response:
    """Counters since this process started: tool calls written, skipped, dropped (queue full
    while the database was away, or unwritten at shutdown) and rejected, batches and failed
    batch attempts, and the calls waiting in memory."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CallLogCollector(request.app[CALL_LOG]))
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )
