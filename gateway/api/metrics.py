"""/metrics: what the gateway's processes count, in the Prometheus text format.

Public, like a scrape target usually is: the figures are process-wide counts, never a tenant's
data (unless GATEWAY_METRICS_PER_SERVER adds server ids). Under `serve --workers N` whichever
worker takes the scrape answers for all (gateway.ops.snapshots), so a series may be a couple of
seconds behind. Every series has a `worker` label (0 when the process runs alone).
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.accounts.access import PUBLIC
from gateway.api.routing import Routes
from gateway.ops.snapshots import scrape

routes = Routes("metrics")


@routes.get(
    "/metrics",
    summary="What the gateway's processes count (Prometheus text format)",
    access=PUBLIC,
    response=str,
    media_type="text/plain",
)
async def metrics(request: web.Request) -> web.Response:
    """Since each process started, labelled by `worker`: proxied requests by method class and
    outcome, the upstream's and the gateway's own time per proxied request (histograms),
    upstream errors by kind, probes by status with their durations, alert evaluations and
    notification attempts by result, cache hits and misses, the database pool (connections,
    waits), and the call log (tool calls written, skipped, dropped and rejected, batches,
    failed batch attempts, calls waiting in memory)."""
    return web.Response(body=scrape(request.app), headers={"Content-Type": CONTENT_TYPE_LATEST})
