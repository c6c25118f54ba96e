"""SQL for health checks: recording probes, listing them, the uptime summary, retention.

Every write goes through record() and prune(), which keep the hourly rollups (health_hourly)
and the per-server counters (servers.checks_*) in step with health_checks in one statement, so
the summary and the list total never have to scan a year of checks.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from gateway.db.types import Executor
from gateway.mcp.probe import ProbeResult

_CHECK_COLUMNS = "id, server_id, status, latency_ms, error, tool_count, tools_hash, checked_at"

# Whether the check being recorded is the server's newest, judged on the row as it is when the
# UPDATE locks it: a probe that finishes after a later one still counts, but does not set the
# server's status.
_NEWEST = "c.checked_at >= coalesce(s.last_checked_at, '-infinity')"

_RECORD = f"""
WITH inserted AS (
    INSERT INTO health_checks
        (server_id, workspace_id, status, latency_ms, error, tool_count, tools_hash, checked_at)
    SELECT id, workspace_id, $2, $3, $4, $5, $6, coalesce($7, now()) FROM servers WHERE id = $1
    RETURNING {_CHECK_COLUMNS}
), hourly AS (
    INSERT INTO health_hourly AS h (server_id, hour, healthy, degraded, down, latency_sum)
    SELECT server_id, date_trunc('hour', checked_at, 'UTC'), (status = 'healthy')::int,
           (status = 'degraded')::int, (status = 'down')::int, latency_ms
    FROM inserted
    ON CONFLICT (server_id, hour) DO UPDATE SET
        healthy = h.healthy + excluded.healthy,
        degraded = h.degraded + excluded.degraded,
        down = h.down + excluded.down,
        latency_sum = h.latency_sum + excluded.latency_sum
), server AS (
    UPDATE servers s SET
        checks_healthy = s.checks_healthy + (c.status = 'healthy')::int,
        checks_degraded = s.checks_degraded + (c.status = 'degraded')::int,
        checks_down = s.checks_down + (c.status = 'down')::int,
        status = CASE WHEN {_NEWEST} THEN c.status ELSE s.status END,
        last_checked_at = CASE WHEN {_NEWEST} THEN c.checked_at ELSE s.last_checked_at END,
        last_latency_ms = CASE WHEN {_NEWEST} THEN c.latency_ms ELSE s.last_latency_ms END,
        -- A check without a tool list (down, JSON-RPC error) keeps the last one known, so a
        -- server coming back with other tools is still seen as a change.
        tool_count = CASE WHEN {_NEWEST} AND c.tools_hash IS NOT NULL
                          THEN c.tool_count ELSE s.tool_count END,
        tools_hash = CASE WHEN {_NEWEST} AND c.tools_hash IS NOT NULL
                          THEN c.tools_hash ELSE s.tools_hash END,
        tools_changed_at = CASE WHEN {_NEWEST} AND c.tools_hash <> s.tools_hash
                                THEN c.checked_at ELSE s.tools_changed_at END
    FROM inserted c
    WHERE s.id = c.server_id
)
SELECT {_CHECK_COLUMNS} FROM inserted
"""

_LIST = f"SELECT {_CHECK_COLUMNS} FROM health_checks WHERE workspace_id = $1"
_LIST_SERVER = " AND server_id = ${n}"
_LIST_STATUS = " AND status = ${n}"
_LIST_PAGE = " ORDER BY checked_at DESC, id DESC LIMIT ${limit} OFFSET ${offset}"

_TOTAL = "SELECT coalesce(sum({counter}), 0) FROM servers WHERE workspace_id = $1"
_TOTAL_SERVER = " AND id = $2"
_COUNTERS = {
    None: "checks_healthy + checks_degraded + checks_down",
    "healthy": "checks_healthy",
    "degraded": "checks_degraded",
    "down": "checks_down",
}

# The window [now - days, now] is read as: raw checks up to the first whole UTC hour, rollups
# for the whole hours, raw checks from the start of the current hour. Servers without checks
# get zeros and nulls.
_SUMMARY = """
WITH bounds AS (
    SELECT now() - make_interval(days => $2) AS since,
           date_trunc('hour', now() - make_interval(days => $2), 'UTC') + interval '1 hour'
               AS first_hour,
           date_trunc('hour', now(), 'UTC') AS this_hour
)
SELECT s.id AS server_id, s.name AS server_name,
       coalesce(sum(w.total), 0)::bigint AS total_checks,
       coalesce(sum(w.healthy), 0)::bigint AS healthy_checks,
       round(100 * sum(w.healthy) / nullif(sum(w.total), 0), 2)::float8 AS uptime_percent,
       round((sum(w.latency_sum) / nullif(sum(w.total), 0))::numeric, 2)::float8
           AS avg_latency_ms,
       s.last_checked_at
FROM servers s
CROSS JOIN bounds b
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE c.status = 'healthy') AS healthy, count(*) AS total,
           sum(c.latency_ms) AS latency_sum
    FROM health_checks c
    WHERE c.server_id = s.id AND c.checked_at >= b.since AND c.checked_at < b.first_hour
    UNION ALL
    SELECT sum(h.healthy), sum(h.healthy + h.degraded + h.down), sum(h.latency_sum)
    FROM health_hourly h
    WHERE h.server_id = s.id AND h.hour >= b.first_hour AND h.hour < b.this_hour
    UNION ALL
    SELECT count(*) FILTER (WHERE c.status = 'healthy'), count(*), sum(c.latency_ms)
    FROM health_checks c
    WHERE c.server_id = s.id AND c.checked_at >= b.this_hour
) w ON true
WHERE s.workspace_id = $1
GROUP BY s.id, s.name, s.last_checked_at
ORDER BY s.name
"""

# Only one process prunes at a time (two could deadlock on the rollup rows they share).
_PRUNE_LOCK = "SELECT pg_try_advisory_xact_lock($1)"
_PRUNE_LOCK_KEY = 0x6D637068  # any constant, the same in every gateway process

# Deletes the oldest batch and takes it off the rollups and counters; returns the rollup rows
# that became empty, for _DROP_EMPTY_HOURS.
_PRUNE = """
WITH gone AS (
    DELETE FROM health_checks c
    USING (
        SELECT id FROM health_checks WHERE checked_at < $1 ORDER BY checked_at LIMIT $2
    ) doomed
    WHERE c.id = doomed.id
    RETURNING c.server_id, date_trunc('hour', c.checked_at, 'UTC') AS hour, c.status,
              c.latency_ms
), hours AS (
    UPDATE health_hourly h SET
        healthy = h.healthy - g.healthy,
        degraded = h.degraded - g.degraded,
        down = h.down - g.down,
        latency_sum = h.latency_sum - g.latency_sum
    FROM (
        SELECT server_id, hour, count(*) FILTER (WHERE status = 'healthy') AS healthy,
               count(*) FILTER (WHERE status = 'degraded') AS degraded,
               count(*) FILTER (WHERE status = 'down') AS down, sum(latency_ms) AS latency_sum
        FROM gone GROUP BY server_id, hour
    ) g
    WHERE h.server_id = g.server_id AND h.hour = g.hour
    RETURNING h.server_id, h.hour, h.healthy + h.degraded + h.down AS remaining
), counters AS (
    UPDATE servers s SET
        checks_healthy = s.checks_healthy - g.healthy,
        checks_degraded = s.checks_degraded - g.degraded,
        checks_down = s.checks_down - g.down
    FROM (
        SELECT server_id, count(*) FILTER (WHERE status = 'healthy') AS healthy,
               count(*) FILTER (WHERE status = 'degraded') AS degraded,
               count(*) FILTER (WHERE status = 'down') AS down
        FROM gone GROUP BY server_id
    ) g
    WHERE s.id = g.server_id
)
SELECT (SELECT count(*) FROM gone) AS deleted,
       coalesce(array_agg(server_id) FILTER (WHERE remaining = 0), '{}') AS empty_servers,
       coalesce(array_agg(hour) FILTER (WHERE remaining = 0), '{}') AS empty_hours
FROM hours
"""

# A separate statement: rows updated by the statement above are not visible to it.
_DROP_EMPTY_HOURS = """
DELETE FROM health_hourly h
USING unnest($1::uuid[], $2::timestamptz[]) AS e (server_id, hour)
WHERE h.server_id = e.server_id AND h.hour = e.hour AND h.healthy + h.degraded + h.down = 0
"""


@dataclass(frozen=True, slots=True)
class CheckFilter:
    server_id: uuid.UUID | None = None
    status: str | None = None


async def record(
    db: Executor,
    server_id: uuid.UUID,
    result: ProbeResult,
    *,
    checked_at: datetime | None = None,
) -> dict[str, Any] | None:
    """Store a probe result and make the server follow it; None if the server is gone.

    `checked_at` defaults to the database's now(); tests and imports may set it.
    """
    try:
        row = await db.fetchrow(
            _RECORD,
            server_id,
            result.status,
            result.latency_ms,
            result.error,
            result.tool_count,
            result.tools_hash,
            checked_at,
        )
    except asyncpg.ForeignKeyViolationError:
        return None  # deleted between our read of it and the insert
    return None if row is None else dict(row)


async def list_checks(
    db: Executor, workspace_id: uuid.UUID, where: CheckFilter, limit: int, offset: int
) -> list[dict[str, Any]]:
    sql = _LIST
    args: list[Any] = [workspace_id]
    for fragment, value in ((_LIST_SERVER, where.server_id), (_LIST_STATUS, where.status)):
        if value is not None:
            args.append(value)
            sql += fragment.format(n=len(args))
    sql += _LIST_PAGE.format(limit=len(args) + 1, offset=len(args) + 2)
    return [dict(r) for r in await db.fetch(sql, *args, limit, offset)]


async def count_checks(db: Executor, workspace_id: uuid.UUID, where: CheckFilter) -> int:
    sql = _TOTAL.format(counter=_COUNTERS[where.status])
    if where.server_id is None:
        total = await db.fetchval(sql, workspace_id)
    else:
        total = await db.fetchval(sql + _TOTAL_SERVER, workspace_id, where.server_id)
    return int(total)


async def summary(db: Executor, workspace_id: uuid.UUID, days: int) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetch(_SUMMARY, workspace_id, days)]


async def prune(pool: asyncpg.Pool, older_than: datetime, batch_size: int) -> int:
    """Delete up to `batch_size` of the oldest checks before `older_than`; returns how many.

    Returns 0 when another process is pruning right now.
    """
    async with pool.acquire() as conn, conn.transaction():
        if not await conn.fetchval(_PRUNE_LOCK, _PRUNE_LOCK_KEY):
            return 0
        row = await conn.fetchrow(_PRUNE, older_than, batch_size)
        assert row is not None
        if row["empty_servers"]:
            await conn.execute(_DROP_EMPTY_HOURS, row["empty_servers"], row["empty_hours"])
        deleted: int = row["deleted"]
        return deleted


# The mean probe latency per server and hour of the last $2 hours (health_hourly: one row per
# server and hour); hours without checks are absent.
_HOURLY_LATENCY = """
SELECT h.server_id, h.hour, h.latency_sum / (h.healthy + h.degraded + h.down) AS latency_ms
FROM health_hourly h JOIN servers s ON s.id = h.server_id
WHERE s.workspace_id = $1 AND h.hour > date_trunc('hour', now()) - $2 * interval '1 hour'
  AND h.healthy + h.degraded + h.down > 0
"""


async def hourly_latency(
    db: Executor, workspace_id: uuid.UUID, hours: int
) -> tuple[list[datetime], dict[uuid.UUID, list[float | None]]]:
    """The last `hours` UTC hours (the current one last) and, per server with checks in them,
    its mean probe latency in each (None where it had none)."""
    now = datetime.now(UTC)
    current = now.replace(minute=0, second=0, microsecond=0)
    axis = [current - timedelta(hours=hours - 1 - i) for i in range(hours)]
    index = {hour: i for i, hour in enumerate(axis)}
    series: dict[uuid.UUID, list[float | None]] = {}
    for row in await db.fetch(_HOURLY_LATENCY, workspace_id, hours):
        position = index.get(row["hour"])
        if position is not None:
            values = series.setdefault(row["server_id"], [None] * hours)
            values[position] = row["latency_ms"]
    return axis, series
