"""/analytics: top tools and hourly call, error and latency series, cached per workspace.

The four endpoints (and the dashboard's analytics page) read one snapshot per workspace,
window, server and toolset filter (gateway.db.analytics.snapshot), cached as one entry:
whichever panels a person looks at, they count the same calls."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import BeforeValidator, Field
from redis.exceptions import RedisError

from gateway.accounts.access import PRINCIPAL, READ
from gateway.api.models import Out, Query
from gateway.api.routing import Routes
from gateway.caching.shared import SHARED_CACHE
from gateway.db import analytics as analytics_db
from gateway.keys import POOL, SETTINGS
from gateway.ops.metrics import METRICS

log = logging.getLogger(__name__)

routes = Routes("analytics")

_CACHE_ERRORS = (OSError, TimeoutError, RedisError)


def _number(value: object) -> object:
    """Query values are strings; the Literal below wants the number."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


class AnalyticsQuery(Query):
    server_id: Annotated[
        uuid.UUID | None,
        Field(description="only calls to this server (one not in your workspace matches none)"),
    ] = None
    toolset_id: Annotated[
        uuid.UUID | None,
        Field(
            description="only calls that came through this toolset (one not in your workspace "
            "matches none); with `server_id`, its calls to that server"
        ),
    ] = None
    days: Annotated[
        Literal[1, 7, 30],
        BeforeValidator(_number),
        Field(
            description="the window: the days * 24 whole UTC hours that end with the current "
            "hour, which counts up to now (at 14:20 with days=1: from 15:00 yesterday to now)"
        ),
    ] = 7


class TopToolsQuery(AnalyticsQuery):
    limit: Annotated[int, Field(ge=1, le=100, description="how many tools (max 100)")] = 10


class TopToolOut(Out):
    tool_name: str
    call_count: int
    error_count: int = Field(description="calls with status `error`")


class ErrorRateOut(Out):
    hour: datetime = Field(description="start of the UTC hour")
    error_rate: float = Field(description="errors / calls, 0..1; 0 for an hour without calls")
    call_count: int


class LatencyOut(Out):
    hour: datetime = Field(description="start of the UTC hour")
    p50_ms: float | None = Field(description="median duration; null without timed calls")
    p95_ms: float | None
    p99_ms: float | None


class VolumeOut(Out):
    hour: datetime = Field(description="start of the UTC hour")
    call_count: int


async def snapshot(request: web.Request, query: AnalyticsQuery) -> dict[str, Any]:
    """The snapshot of the workspace's window, server and toolset filter (gateway.db.analytics),
    from the shared cache, else read now and stored there. The current hour is part of the key,
    so a cached series never lags a whole hour behind the clock; `limit` is not (a snapshot
    keeps as many top tools as any request may ask for)."""
    app = request.app
    workspace_id = request[PRINCIPAL].workspace_id
    window = analytics_db.Window.of_days(query.days, datetime.now(UTC))
    key = (
        f"analytics:snapshot:{workspace_id}:{window.last_hour:%Y%m%d%H}:"
        f"days={query.days}:server_id={query.server_id}:toolset_id={query.toolset_id}"
    )
    cache = app[SHARED_CACHE]
    try:
        answer: dict[str, Any] | None = await cache.get(key)
    except _CACHE_ERRORS as exc:
        log.warning("analytics cache unavailable, computing instead: %s", exc)
        answer = None
    app[METRICS].cache_requests.inc("analytics", "miss" if answer is None else "hit")
    if answer is not None:
        return answer
    async with app[POOL].acquire() as conn:
        answer = await analytics_db.snapshot(
            conn, analytics_db.Scope(workspace_id, query.server_id, window, query.toolset_id)
        )
    try:
        await cache.set(key, answer, ttl=app[SETTINGS].analytics_cache_seconds)
    except _CACHE_ERRORS as exc:
        log.warning("analytics cache unavailable, not storing: %s", exc)
    return answer


@routes.get(
    "/analytics/top-tools",
    summary="The most called tools of the window",
    access=READ,
    response=list[TopToolOut],
)
async def top_tools(request: web.Request, query: TopToolsQuery) -> list[dict[str, Any]]:
    """Up to `limit` tools by `call_count`, highest first, ties by name; the calls of a tool on
    all servers (or on `server_id`) count together. Exact counts from the hourly rollups;
    cached for GATEWAY_ANALYTICS_CACHE_SECONDS (300) per workspace, days, server_id and
    toolset_id. A toolset's tools are named here as their servers name them (a toolset may
    show them with a prefix)."""
    return list((await snapshot(request, query))["top_tools"][: query.limit])


@routes.get(
    "/analytics/error-rates",
    summary="Hourly error rate",
    access=READ,
    response=list[ErrorRateOut],
)
async def error_rates(request: web.Request, query: AnalyticsQuery) -> list[dict[str, Any]]:
    """One item per hour of the window (days * 24), oldest first, hours without calls
    included. Exact counts from the hourly rollups; cached for GATEWAY_ANALYTICS_CACHE_SECONDS
    (300) per workspace, days, server_id and toolset_id."""
    return analytics_db.error_rates((await snapshot(request, query))["hourly"])


@routes.get(
    "/analytics/latency",
    summary="Hourly p50, p95 and p99 of call durations",
    access=READ,
    response=list[LatencyOut],
)
async def latency(request: web.Request, query: AnalyticsQuery) -> list[dict[str, Any]]:
    """One item per hour of the window (days * 24), oldest first, null for hours without timed
    calls. Nearest-rank percentiles of the calls that reported `duration_ms`, read from hourly
    histograms: within 1% of the exact value, in ms with 2 decimals. Cached for
    GATEWAY_ANALYTICS_CACHE_SECONDS (300) per workspace, days, server_id and toolset_id."""
    return list((await snapshot(request, query))["latency"])


@routes.get(
    "/analytics/volume",
    summary="Hourly call count",
    access=READ,
    response=list[VolumeOut],
)
async def volume(request: web.Request, query: AnalyticsQuery) -> list[dict[str, Any]]:
    """One item per hour of the window (days * 24), oldest first, 0 for hours without calls.
    Exact counts from the hourly rollups; cached for GATEWAY_ANALYTICS_CACHE_SECONDS (300) per
    workspace, days, server_id and toolset_id."""
    return analytics_db.volume((await snapshot(request, query))["hourly"])
