"""The overview: is anything wrong? Servers and their health, the last day's calls and errors,
open alerts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, get_args

from aiohttp import web

from gateway.api import health as health_api
from gateway.api import servers as servers_api
from gateway.api.health import SummaryQuery
from gateway.api.models import ServerStatus
from gateway.api.servers import ServerQuery
from gateway.dashboard import charts
from gateway.dashboard.pages import Pages, call
from gateway.dashboard.sessions import SESSION
from gateway.db import alerts as alerts_db
from gateway.db import analytics as analytics_db
from gateway.db import health_checks as health_db
from gateway.keys import POOL

pages = Pages()

_PROBLEMS = ("down", "degraded")


@pages.get("/", "overview.html")
async def overview(request: web.Request) -> dict[str, Any]:
    workspace_id = request[SESSION].workspace_id
    assert workspace_id is not None
    servers = await call(request, servers_api.list_servers, query=ServerQuery())
    uptime = {
        item["server_id"]: item
        for item in await call(request, health_api.summary, query=SummaryQuery(days=1))
    }
    _, latencies = await health_db.hourly_latency(request.app[POOL], workspace_id, 24)
    # Live, not the API's 5-minute cache: this is the page people look at after a change.
    last_day = analytics_db.Scope(
        workspace_id, None, analytics_db.Window.of_days(1, datetime.now(UTC))
    )
    hourly = await analytics_db.error_rates(request.app[POOL], last_day)
    incidents = await alerts_db.open_incidents(request.app[POOL], workspace_id)
    calls = sum(h["call_count"] for h in hourly)
    errors = sum(round(h["error_rate"] * h["call_count"]) for h in hourly)
    counts = dict.fromkeys(get_args(ServerStatus), 0)
    for server in servers:
        counts[server["status"]] += 1
        server["uptime"] = uptime.get(server["id"], {}).get("uptime_percent")
        server["sparkline"] = charts.sparkline(
            latencies.get(server["id"], []),
            label=f"mean probe latency of {server['name']}, by hour",
        )
    return {
        "section": "overview",
        "servers": sorted(servers, key=lambda s: (s["status"] not in _PROBLEMS, s["name"])),
        "counts": counts,
        "troubled": counts["down"] + counts["degraded"],
        "incidents": incidents,
        "calls": calls,
        "errors": errors,
        "error_rate": errors / calls if calls else None,
        "volume_line": charts.sparkline(
            [h["call_count"] for h in hourly], label="calls per hour, last 24 hours"
        ),
        "error_line": charts.sparkline(
            [h["error_rate"] if h["call_count"] else None for h in hourly],
            label="error rate per hour, last 24 hours",
        ),
    }
