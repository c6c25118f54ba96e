"""SQL for analytics: top tools and hourly series of a workspace, from the hourly rollups.

A window of `days` is the days * 24 whole UTC hours that end with the current hour, which is
included as far as it has gone. Every figure comes from tool_call_hourly (never from raw calls):
counts are exact, since the rollups are written in the calls' own transactions. Latency
percentiles are nearest-rank, read from each hour's merged histogram (within 1% of the exact
value, see gateway/calllog.py). Merging 30 days of histograms of every tool takes about a second,
so the percentiles of past hours are kept in tool_call_latency_hourly together with a
fingerprint of the rollup rows they came from, and recomputed when those rows change.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from gateway.calllog import percentile
from gateway.db.rollups import floor_hour
from gateway.db.types import Executor

PERCENTILES = (0.5, 0.95, 0.99)


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
    """The rollup rows of a workspace in a window, optionally of one of its servers."""

    workspace_id: uuid.UUID
    server_id: uuid.UUID | None
    window: Window

    def where(self) -> tuple[str, list[Any]]:
        """Conditions on tool_call_hourly ($1 workspace, $2 and $3 the hours, $4 server)."""
        sql = "workspace_id = $1 AND hour BETWEEN $2 AND $3"
        args: list[Any] = [self.workspace_id, self.window.first_hour, self.window.last_hour]
        if self.server_id is not None:
            sql += " AND server_id = $4"
            args.append(self.server_id)
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

# One 64-bit digest of the rollup rows of an hour that hold latencies: it changes whenever one
# of them gains a timed call (its count and sum change) or goes away (a deleted server).
_FINGERPRINT = """
bit_xor(hashtextextended(tool_name, uuid_hash_extended(server_id,
    hashint8extended(duration_sum_ms, duration_count))))
"""

# The hours with latencies, and the stored percentiles of those whose rollups are unchanged
# (null for the others). Reads the counters only: an index-only scan of
# tool_call_hourly_hour_idx, or tool_call_hourly_server_idx for one server.
_KNOWN_PERCENTILES = f"""
WITH hours AS (
    SELECT hour, {_FINGERPRINT} AS fingerprint
    FROM tool_call_hourly
    WHERE {{where}} AND duration_count > 0
    GROUP BY hour
)
SELECT h.hour, p.p50_ms, p.p95_ms, p.p99_ms
FROM hours AS h
LEFT JOIN tool_call_latency_hourly AS p
       ON p.scope = ${{scope}} AND p.hour = h.hour AND p.fingerprint = h.fingerprint
"""

# The merged histogram of each of some hours, with the fingerprint of the rows merged.
_MERGED = f"""
SELECT hour, {_FINGERPRINT} AS fingerprint, histogram_sum(latency_histogram) AS histogram
FROM tool_call_hourly
WHERE workspace_id = $1 AND hour = ANY($2::timestamptz[]) {{server}} AND duration_count > 0
GROUP BY hour
"""

# Keeps the percentiles of past hours; drops those older than any window will ask for.
_STORE = """
WITH pruned AS (
    DELETE FROM tool_call_latency_hourly WHERE scope = coalesce($2::uuid, $1::uuid) AND hour < $3
)
INSERT INTO tool_call_latency_hourly AS p
    (workspace_id, server_id, hour, fingerprint, p50_ms, p95_ms, p99_ms)
SELECT $1::uuid, $2::uuid, u.hour, u.fingerprint, u.p50, u.p95, u.p99
FROM unnest($4::timestamptz[], $5::bigint[], $6::float8[], $7::float8[], $8::float8[])
     AS u (hour, fingerprint, p50, p95, p99)
ORDER BY u.hour
ON CONFLICT (scope, hour) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    p50_ms = excluded.p50_ms,
    p95_ms = excluded.p95_ms,
    p99_ms = excluded.p99_ms
"""

# How far back stored percentiles are kept: the longest window.
KEEP = timedelta(days=30)


async def top_tools(db: Executor, scope: Scope, limit: int) -> list[dict[str, Any]]:
    where, args = scope.where()
    rows = await db.fetch(_TOP_TOOLS.format(where=where, limit=len(args) + 1), *args, limit)
    return [dict(row) for row in rows]


async def volume(db: Executor, scope: Scope) -> list[dict[str, Any]]:
    counts = await _hourly_counts(db, scope)
    return _series(scope.window, counts, lambda c: {"call_count": c[0]}, {"call_count": 0})


async def error_rates(db: Executor, scope: Scope) -> list[dict[str, Any]]:
    counts = await _hourly_counts(db, scope)
    return _series(
        scope.window,
        counts,
        lambda c: {"error_rate": c[1] / c[0] if c[0] else 0.0, "call_count": c[0]},
        {"error_rate": 0.0, "call_count": 0},
    )


async def latency(db: Executor, scope: Scope) -> list[dict[str, Any]]:
    where, args = scope.where()
    rows = await db.fetch(
        _KNOWN_PERCENTILES.format(where=where, scope=len(args) + 1),
        *args,
        scope.server_id or scope.workspace_id,
    )
    known = {row["hour"]: (row["p50_ms"], row["p95_ms"], row["p99_ms"]) for row in rows}
    stale = [hour for hour, values in known.items() if values[0] is None]
    if stale:
        known.update(await _compute_percentiles(db, scope, stale))
    empty = {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    return _series(
        scope.window,
        {hour: values for hour, values in known.items() if values[0] is not None},
        lambda v: {"p50_ms": v[0], "p95_ms": v[1], "p99_ms": v[2]},
        empty,
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


def percentiles_of(histogram: Sequence[int]) -> tuple[float, float, float] | None:
    """p50, p95, p99 of a latency histogram (ms, 2 decimals); None when it is empty."""
    p50, p95, p99 = (percentile(histogram, fraction) for fraction in PERCENTILES)
    if p50 is None or p95 is None or p99 is None:
        return None
    return round(p50, 2), round(p95, 2), round(p99, 2)


async def _compute_percentiles(
    db: Executor, scope: Scope, hours: list[datetime]
) -> dict[datetime, tuple[float, float, float]]:
    """Merge the histograms of some hours and keep the percentiles of those that are over."""
    server = "" if scope.server_id is None else "AND server_id = $3"
    args: list[Any] = [scope.workspace_id, hours]
    if scope.server_id is not None:
        args.append(scope.server_id)
    rows = await db.fetch(_MERGED.format(server=server), *args)
    computed: dict[datetime, tuple[float, float, float]] = {}
    past: list[tuple[datetime, int, tuple[float, float, float]]] = []
    for row in rows:
        values = percentiles_of(row["histogram"] or [])
        if values is None:
            continue
        computed[row["hour"]] = values
        # The current hour changes with every call: not worth keeping.
        if row["hour"] < scope.window.last_hour:
            past.append((row["hour"], row["fingerprint"], values))
    if past:
        await _store(db, scope, past)
    return computed


async def _store(
    db: Executor, scope: Scope, rows: list[tuple[datetime, int, tuple[float, float, float]]]
) -> None:
    # The server or workspace may be deleted meanwhile: then there is nothing to keep.
    with contextlib.suppress(asyncpg.ForeignKeyViolationError):
        await db.execute(
            _STORE,
            scope.workspace_id,
            scope.server_id,
            scope.window.last_hour - KEEP,
            [hour for hour, _, _ in rows],
            [fingerprint for _, fingerprint, _ in rows],
            [values[0] for _, _, values in rows],
            [values[1] for _, _, values in rows],
            [values[2] for _, _, values in rows],
        )
