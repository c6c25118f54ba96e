"""/health: stored probe results and per-server uptime."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from aiohttp import web
from pydantic import Field

from gateway.accounts.access import PRINCIPAL, READ
from gateway.api.models import CheckStatus, Out, Page, Query
from gateway.api.routing import Routes
from gateway.db import health_checks as health_checks_db
from gateway.keys import POOL

routes = Routes("health")


class HealthCheckOut(Out):
    id: uuid.UUID
    server_id: uuid.UUID
    status: CheckStatus = Field(
        description="healthy: connected and listed tools within the degraded threshold; "
        "degraded: slower, answered with a JSON-RPC error, or with a tool list over the "
        "gateway's bounds (8 MiB, 2,000 tools); down: unreachable, timed out, "
        "non-2xx, or not an MCP endpoint"
    )
    latency_ms: float = Field(description="time until the tool list (or the failure)")
    error: str | None = Field(description="why the check is not healthy, for a person to read")
    tool_count: int | None = Field(description="number of tools listed; null if tools/list failed")
    tools_hash: str | None = Field(
        description="sha256 of the tool list (order-independent); null if tools/list failed"
    )
    checked_at: datetime


class HealthCheckPage(Out):
    items: list[HealthCheckOut]
    total: int


class ChecksQuery(Page):
    server_id: uuid.UUID | None = None
    status: CheckStatus | None = None


class SummaryQuery(Query):
    days: Annotated[int, Field(ge=1, le=365, description="lookback in days (max 365)")] = 30


class SummaryItem(Out):
    server_id: uuid.UUID
    server_name: str
    uptime_percent: float | None = Field(
        description="100 * healthy_checks / total_checks, 2 decimals; null without checks"
    )
    total_checks: int
    healthy_checks: int
    avg_latency_ms: float | None = Field(
        description="mean latency of every check in the window (failed ones included), "
        "2 decimals; null without checks"
    )
    last_checked_at: datetime | None = Field(description="the server's latest check, if any")


@routes.get(
    "/health/checks",
    summary="Stored probe results, newest first",
    access=READ,
    response=HealthCheckPage,
)
async def list_checks(request: web.Request, query: ChecksQuery) -> dict[str, Any]:
    """A `server_id` of another workspace simply matches nothing."""
    pool = request.app[POOL]
    workspace_id = request[PRINCIPAL].workspace_id
    where = health_checks_db.CheckFilter(server_id=query.server_id, status=query.status)
    items = await health_checks_db.list_checks(pool, workspace_id, where, query.limit, query.offset)
    total = await health_checks_db.count_checks(pool, workspace_id, where)
    return {"items": items, "total": total}


@routes.get(
    "/health/summary",
    summary="Uptime per server over the last `days` days",
    access=READ,
    response=list[SummaryItem],
)
async def summary(request: web.Request, query: SummaryQuery) -> list[dict[str, Any]]:
    """One item per server of the workspace, ordered by name, also for servers without
    checks in the window."""
    return await health_checks_db.summary(
        request.app[POOL], request[PRINCIPAL].workspace_id, query.days
    )
