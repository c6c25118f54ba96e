"""SQL for the alert metrics of some servers over a window of time.

Whole hours come from the hourly rollups and only the partial hours at the window's edges from
the raw rows, so a day-long window reads at most 24 rollup rows per tool and server while a
five-minute window is exact. p95 is the nearest-rank percentile: exact (percentile_disc) when
the window holds no whole hour, else read from the merged latency histograms (within 1%): each
server's hourly ones in latency_hourly, plus those of the edges' raw rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gateway.db import server_tools as server_tools_db
from gateway.db.histograms import percentile
from gateway.db.rollups import ceil_hour, floor_hour
from gateway.db.types import Executor

CALL_METRICS = ("error_rate", "avg_latency_ms", "call_count")


@dataclass(frozen=True, slots=True)
class Window:
    """[start, end], split at whole hours: raw rows in [start, first_hour) and [last_hour, end],
    rollups for the hours in [first_hour, last_hour). Without a whole hour both are `end`."""

    start: datetime
    end: datetime
    first_hour: datetime
    last_hour: datetime

    @classmethod
    def ending(cls, end: datetime, minutes: int) -> Window:
        start = end - timedelta(minutes=minutes)
        first_hour = ceil_hour(start)
        last_hour = floor_hour(end)
        if first_hour >= last_hour:
            first_hour = last_hour = end
        return cls(start, end, first_hour, last_hour)

    @property
    def has_whole_hours(self) -> bool:
        return self.first_hour < self.last_hour


# $1 servers, $2 start, $3 first_hour, $4 last_hour, $5 end.
_RAW_EDGES = """
(created_at >= $2 AND created_at < $3 OR created_at >= $4 AND created_at <= $5)
"""

_CALL_TOTALS = f"""
SELECT server_id, sum(calls)::bigint AS calls, sum(errors)::bigint AS errors,
       sum(timed)::bigint AS timed, sum(duration_sum)::float8 AS duration_sum
FROM (
    SELECT server_id, count(*) AS calls, count(*) FILTER (WHERE status = 'error') AS errors,
           count(duration_ms) AS timed, coalesce(sum(duration_ms), 0) AS duration_sum
    FROM tool_calls
    WHERE server_id = ANY($1::uuid[]) AND {_RAW_EDGES}
    GROUP BY server_id
    UNION ALL
    SELECT server_id, sum(call_count), sum(error_count), sum(duration_count), sum(duration_sum_ms)
    FROM tool_call_hourly
    WHERE server_id = ANY($1::uuid[]) AND hour >= $3 AND hour < $4
    GROUP BY server_id
) AS parts
GROUP BY server_id
"""

_P95_EXACT = """
SELECT server_id, percentile_disc(0.95) WITHIN GROUP (ORDER BY duration_ms)::float8 AS p95
FROM tool_calls
WHERE server_id = ANY($1::uuid[]) AND created_at >= $2 AND created_at <= $3
  AND duration_ms IS NOT NULL
GROUP BY server_id
"""

_HISTOGRAMS = f"""
SELECT server_id, histogram_sum(histogram) AS histogram
FROM (
    SELECT server_id,
           histogram_of(array_agg(latency_bucket(duration_ms)), array_agg(1::bigint)) AS histogram
    FROM tool_calls
    WHERE server_id = ANY($1::uuid[]) AND {_RAW_EDGES} AND duration_ms IS NOT NULL
    GROUP BY server_id
    UNION ALL
    SELECT scope, latency_histogram
    FROM latency_hourly
    WHERE scope = ANY($1::uuid[]) AND hour >= $3 AND hour < $4
) AS parts
GROUP BY server_id
"""

# The newest probe in the window, per server (the health_checks (server_id, checked_at) index).
_LATEST_PROBE = """
SELECT DISTINCT ON (server_id) server_id, status
FROM health_checks
WHERE server_id = ANY($1::uuid[]) AND checked_at >= $2 AND checked_at <= $3
ORDER BY server_id, checked_at DESC
"""


async def measure(
    db: Executor, metric: str, server_ids: Sequence[uuid.UUID], window: Window
) -> dict[uuid.UUID, float]:
    """The metric per server; a server without data for it is left out (no calls in the window
    for the rate and latency metrics, no probe in the window for server_down). call_count of a
    server without calls is 0, and tool_changes of one whose tools did not change: that is a
    measurement, not missing data."""
    servers = list(server_ids)
    if not servers:
        return {}
    if metric in CALL_METRICS:
        return await _call_metric(db, metric, servers, window)
    if metric == "p95_latency_ms":
        return await _p95(db, servers, window)
    if metric == "tool_changes":
        return await server_tools_db.changes_in_window(db, servers, window.start, window.end)
    if metric == "server_down":
        rows = await db.fetch(_LATEST_PROBE, servers, window.start, window.end)
        return {row["server_id"]: 1.0 if row["status"] == "down" else 0.0 for row in rows}
    raise ValueError(f"unknown metric {metric!r}")


async def _call_metric(
    db: Executor, metric: str, servers: list[uuid.UUID], window: Window
) -> dict[uuid.UUID, float]:
    rows = await db.fetch(
        _CALL_TOTALS, servers, window.start, window.first_hour, window.last_hour, window.end
    )
    values: dict[uuid.UUID, float] = {}
    if metric == "call_count":
        values = dict.fromkeys(servers, 0.0)
    for row in rows:
        if metric == "call_count":
            values[row["server_id"]] = float(row["calls"])
        elif metric == "error_rate" and row["calls"]:
            values[row["server_id"]] = row["errors"] / row["calls"]
        elif metric == "avg_latency_ms" and row["timed"]:
            values[row["server_id"]] = row["duration_sum"] / row["timed"]
    return values


async def _p95(db: Executor, servers: list[uuid.UUID], window: Window) -> dict[uuid.UUID, float]:
    if not window.has_whole_hours:
        rows = await db.fetch(_P95_EXACT, servers, window.start, window.end)
        return {row["server_id"]: row["p95"] for row in rows}
    rows = await db.fetch(
        _HISTOGRAMS, servers, window.start, window.first_hour, window.last_hour, window.end
    )
    values = {}
    for row in rows:
        value = percentile(row["histogram"] or [], 0.95)
        if value is not None:
            values[row["server_id"]] = value
    return values
