"""Analytics: top tools, error rate, latency percentiles and volume over 1, 7 or 30 days, for
the workspace, one server, the calls through one toolset, or both. Every panel reads the one
snapshot the API's endpoints answer from (gateway.api.analytics.snapshot), so the cards, the
charts and the top tools count the same calls."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aiohttp import web

from gateway.api import analytics as analytics_api
from gateway.api import servers as servers_api
from gateway.api.analytics import AnalyticsQuery
from gateway.api.servers import ServerQuery
from gateway.dashboard import charts
from gateway.dashboard.pages import FormInvalid, Pages, authorize, call, validated
from gateway.dashboard.tool_calls import toolset_choices
from gateway.db import analytics as analytics_db

pages = Pages()

DAYS = (1, 7, 30)
TOP_TOOLS = 10


def _hour(value: datetime | str) -> datetime:
    # A cached answer comes back as JSON: its hours are ISO strings.
    return datetime.fromisoformat(value) if isinstance(value, str) else value


@pages.get("/analytics", "analytics.html")
async def analytics(request: web.Request) -> dict[str, Any]:
    filters = {
        k: v for k in ("days", "server_id", "toolset_id") if (v := request.query.get(k, "").strip())
    }
    servers = await call(request, servers_api.list_servers, query=ServerQuery())
    context: dict[str, Any] = {
        "section": "analytics",
        "filters": filters,
        "servers": servers,
        "toolsets": await toolset_choices(request, filters.get("toolset_id")),
        "days_choices": DAYS,
        "errors": {},
    }
    try:
        query = validated(AnalyticsQuery, filters)
    except FormInvalid as exc:
        context["errors"] = exc.errors
        return context
    # The endpoints' own access rule; then one snapshot for every panel of the page.
    await authorize(request, analytics_api.volume)
    snapshot = await analytics_api.snapshot(request, query)
    top = snapshot["top_tools"][:TOP_TOOLS]
    hourly = snapshot["hourly"]
    rates = analytics_db.error_rates(hourly)
    latency = snapshot["latency"]
    hours = [_hour(item["hour"]) for item in hourly]
    counts = [item["call_count"] for item in hourly]
    errors = [item["error_count"] for item in hourly]
    total = sum(counts)
    span = f"last {query.days * 24} hours" if query.days == 1 else f"last {query.days} days"
    context.update(
        days=query.days,
        span=span,
        top=top,
        top_max=max((t["call_count"] for t in top), default=0),
        # The calls of the tools past the first TOP_TOOLS, so the table adds up to the total.
        other_calls=total - sum(t["call_count"] for t in top),
        other_errors=sum(errors) - sum(t["error_count"] for t in top),
        total=total,
        error_total=sum(errors),
        error_rate=sum(errors) / total if total else None,
        volume_chart=charts.bars(hours, counts, label=f"calls per hour, {span}", unit=" calls"),
        volume_peak=max(counts, default=0),
        error_chart=charts.bars(
            hours,
            [item["error_rate"] * 100 for item in rates],
            label=f"error rate per hour, {span}",
            unit=" %",
            css="bar-error",
        ),
        error_peak=max((item["error_rate"] * 100 for item in rates), default=0),
        latency_chart=charts.lines(
            hours,
            {
                "p50": [item["p50_ms"] for item in latency],
                "p95": [item["p95_ms"] for item in latency],
                "p99": [item["p99_ms"] for item in latency],
            },
            label=f"latency percentiles per hour, {span}",
            unit=" ms",
        ),
        latency_peak=charts.peak([item["p99_ms"] for item in latency]),
        first_hour=hours[0] if hours else None,
    )
    return context
