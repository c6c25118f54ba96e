"""The overview: is anything wrong? A verdict first, then servers and their health, the last
day's calls and errors, open alerts."""

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
from gateway.dashboard.filters import percent, plural
from gateway.dashboard.pages import Pages, call
from gateway.dashboard.sessions import SESSION
from gateway.db import alerts as alerts_db
from gateway.db import analytics as analytics_db
from gateway.db import health_checks as health_db
from gateway.keys import POOL

pages = Pages()

_PROBLEMS = ("down", "degraded")

# The verdict asks for attention when this share of the last 24 hours' calls failed or more:
# where the Error rate figure turns amber, and the threshold the alert rule form suggests
# (0.05). One failed call of two counts too: an error rate is worth a look however few calls.
ERROR_RATE_ATTENTION = 0.05


def verdict(
    counts: dict[str, int], incidents: int, calls: int, errors: int, tools_waiting: int = 0
) -> dict[str, Any] | None:
    """The banner: `level` bad (anything wrong: a server down or degraded, an alert firing,
    the error rate at ERROR_RATE_ATTENTION or more, pinned tools refused until someone approves
    them), waiting (nothing wrong, but servers not
    probed yet) or good, and what it is based on. None without servers or calls."""
    rate = errors / calls if calls else None
    problems = []
    if counts["down"]:
        problems.append(f"{plural(counts['down'], 'server')} down")
    if counts["degraded"]:
        problems.append(f"{plural(counts['degraded'], 'server')} degraded")
    if incidents:
        problems.append(f"{plural(incidents, 'alert')} firing")
    if rate is not None and rate >= ERROR_RATE_ATTENTION:
        problems.append(f"{percent(rate)} of calls failed ({errors:,} of {calls:,})")
    if tools_waiting:
        waiting = plural(tools_waiting, "pinned tool")
        problems.append(f"{waiting} new or changed, refused until approved")
    if problems:
        return {"level": "bad", "title": "Needs attention", "reasons": problems}
    if not sum(counts.values()) and not calls:
        return None
    if counts["unknown"]:
        waiting = f"{plural(counts['unknown'], 'server')} not probed yet"
        return {"level": "waiting", "title": "Waiting", "reasons": [waiting]}
    reasons = [
        "no server down or degraded",
        "no alert firing",
        f"{percent(rate)} of calls failed" if rate is not None else "no calls yet",
    ]
    return {"level": "good", "title": "All clear", "reasons": reasons}


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
    hourly = await analytics_db.hourly_counts(request.app[POOL], last_day)
    incidents = await alerts_db.open_incidents(request.app[POOL], workspace_id)
    calls = sum(h["call_count"] for h in hourly)
    errors = sum(h["error_count"] for h in hourly)
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
        "verdict": verdict(
            counts, len(incidents), calls, errors, sum(s["tools_waiting"] for s in servers)
        ),
        "error_rate_attention": ERROR_RATE_ATTENTION,
        "servers": sorted(servers, key=lambda s: (s["status"] not in _PROBLEMS, s["name"])),
        "counts": counts,
        "incidents": incidents,
        "calls": calls,
        "errors": errors,
        "error_rate": errors / calls if calls else None,
        "volume_line": charts.sparkline(
            [h["call_count"] for h in hourly], label="calls per hour, last 24 hours"
        ),
        "error_line": charts.sparkline(
            [h["error_count"] / h["call_count"] if h["call_count"] else None for h in hourly],
            label="error rate per hour, last 24 hours",
        ),
    }
