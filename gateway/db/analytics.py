"""SQL for analytics: top tools and hourly series of a workspace, from the hourly rollups.

A window of `days` is the days * 24 whole UTC hours that end with the current hour, which is
included as far as it has gone. Every figure comes from the rollups (never from raw calls), which
are written in the calls' own transactions, so counts are exact: tool_call_hourly for counts,
latency_hourly (one merged histogram per hour of the workspace, of one server or of one toolset)
for latency.
Percentiles are nearest-rank, read from those histograms (within 1% of the exact value, see
gateway/histograms.py).

Every page and endpoint reads one snapshot of a scope (`snapshot`): its queries run in one
repeatable-read transaction, so the top tools, the hourly counts and the latency all count the
same calls, even while new ones land.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gateway.db.histograms import percentiles
from gateway.db.rollups import floor_hour
from gateway.db.types import Connection, Executor

PERCENTILES = (0.5, 0.95, 0.99)
# A snapshot keeps this many top tools: the most GET /analytics/top-tools may ask for.
TOP_TOOLS_KEPT = 100


@dataclass(frozen=True, slots=True)
class Window:
    """The hours first_hour .. last_hour (both included, last_hour is the current hour)."""

    first_hour: datetime
    last_hour: datetime

    @classmethod
    def of_days(cls, days: int, now: datetime) -> Window:
        last_hour = floor_hour(now)
        return cls(last_hour - timedelta(hours=days * 24 - 1), last_hour)

    def hours(self) -> list[datetime]:
        count = int((self.last_hour - self.first_hour) / timedelta(hours=1)) + 1
        return [self.first_hour + timedelta(hours=i) for i in range(count)]


@dataclass(frozen=True, slots=True)
class Scope:
    """The rollup rows of a workspace in a window, optionally only those of one of its servers,
    of the calls that came through one toolset, or both."""

    workspace_id: uuid.UUID
    server_id: uuid.UUID | None
    window: Window
    toolset_id: uuid.UUID | None = None

    def where(self) -> tuple[str, list[Any]]:
        """Conditions on tool_call_hourly ($1 workspace, $2 and $3 the hours, then the server
        and the toolset, those given)."""
        sql = "workspace_id = $1 AND hour BETWEEN $2 AND $3"
        args: list[Any] = [self.workspace_id, self.window.first_hour, self.window.last_hour]
        if self.server_id is not None:
            args.append(self.server_id)
            sql += f" AND server_id = ${len(args)}"
        if self.toolset_id is not None:
            args.append(self.toolset_id)
            sql += f" AND toolset_id = ${len(args)}"
        return sql, args


# Ties in call_count are ordered by name, bytewise.
_TOP_TOOLS = """
SELECT tool_name, sum(call_count)::bigint AS call_count, sum(error_count)::bigint AS error_count
FROM tool_call_hourly
WHERE {where}
GROUP BY tool_name
ORDER BY sum(call_count) DESC, tool_name COLLATE "C"
LIMIT ${limit}
"""

_HOURLY_COUNTS = """
SELECT hour, sum(call_count)::bigint AS call_count, sum(error_count)::bigint AS error_count
FROM tool_call_hourly
WHERE {where}
GROUP BY hour
"""

# At most one row per hour of the window: the scope is the server, the toolset, or the whole
# workspace. The workspace condition keeps a server or toolset of another workspace from
# matching anything.
_LATENCY = """
SELECT hour, latency_histogram FROM latency_hourly
WHERE scope = $1 AND workspace_id = $2 AND hour BETWEEN $3 AND $4
"""

# One server's calls through one toolset have no latency_hourly scope of their own: their
# histograms are merged from tool_call_hourly (a row per tool of the server and hour, few
# beside a workspace's).
_LATENCY_MERGED = """
SELECT hour, histogram_sum(latency_histogram) AS latency_histogram FROM tool_call_hourly
WHERE {where}
GROUP BY hour
"""


async def snapshot(conn: Connection, scope: Scope) -> dict[str, Any]:
    """What the analytics show of a scope, JSON-ready: `top_tools` (the TOP_TOOLS_KEPT most
    called), `hourly` (call_count and error_count of every hour of the window) and `latency`
    (p50_ms, p95_ms, p99_ms of every hour). Read in one snapshot of the database: a batch of
    calls written meanwhile is in all three or in none."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return {
            "top_tools": await _top_tools(conn, scope, TOP_TOOLS_KEPT),
            "hourly": await hourly_counts(conn, scope),
            "latency": await _latency(conn, scope),
        }


def volume(hourly: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The call count of each hour of a snapshot's `hourly`."""
    return [{"hour": h["hour"], "call_count": h["call_count"]} for h in hourly]


def error_rates(hourly: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The error rate (0..1, 0.0 for an hour without calls) of each hour of a snapshot's
    `hourly`."""
    return [
        {
            "hour": h["hour"],
            "error_rate": h["error_count"] / h["call_count"] if h["call_count"] else 0.0,
            "call_count": h["call_count"],
        }
        for h in hourly
    ]


async def hourly_counts(db: Executor, scope: Scope) -> list[dict[str, Any]]:
    """The `hourly` part of a snapshot alone (one query: consistent by itself)."""
    counts = await _hourly_counts(db, scope)
    return _series(
        scope.window,
        counts,
        lambda c: {"call_count": c[0], "error_count": c[1]},
        {"call_count": 0, "error_count": 0},
    )


async def _top_tools(db: Executor, scope: Scope, limit: int) -> list[dict[str, Any]]:
    where, args = scope.where()
    rows = await db.fetch(_TOP_TOOLS.format(where=where, limit=len(args) + 1), *args, limit)
    return [dict(row) for row in rows]


async def _latency(db: Executor, scope: Scope) -> list[dict[str, Any]]:
    if scope.server_id is not None and scope.toolset_id is not None:
        where, args = scope.where()
        rows = await db.fetch(_LATENCY_MERGED.format(where=where), *args)
    else:
        rows = await db.fetch(
            _LATENCY,
            scope.server_id or scope.toolset_id or scope.workspace_id,
            scope.workspace_id,
            scope.window.first_hour,
            scope.window.last_hour,
        )
    values = {}
    for row in rows:
        read = percentiles(row["latency_histogram"], PERCENTILES)
        if read is not None:
            values[row["hour"]] = [round(value, 2) for value in read]
    return _series(
        scope.window,
        values,
        lambda v: {"p50_ms": v[0], "p95_ms": v[1], "p99_ms": v[2]},
        {"p50_ms": None, "p95_ms": None, "p99_ms": None},
    )


async def _hourly_counts(db: Executor, scope: Scope) -> dict[datetime, tuple[int, int]]:
    where, args = scope.where()
    rows = await db.fetch(_HOURLY_COUNTS.format(where=where), *args)
    return {row["hour"]: (row["call_count"], row["error_count"]) for row in rows}


def _series(
    window: Window,
    values: dict[datetime, Any],
    item: Callable[[Any], dict[str, Any]],
    empty: dict[str, Any],
) -> list[dict[str, Any]]:
    """One JSON-ready item per hour of the window, oldest first; `empty` for hours without."""
    series = []
    for hour in window.hours():
        value = values.get(hour)
        series.append({"hour": hour.isoformat(), **(empty if value is None else item(value))})
    return series
