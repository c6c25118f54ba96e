"""The hourly rollups of tool calls: their hours, the one statement that computes them, and
rebuilding them.

Three tables, all keyed by UTC hour: tool_call_hourly (per workspace, server and tool: counts,
durations and a latency histogram), tool_call_caller_hourly (the same counts per caller_agent
too) and latency_hourly (one merged latency histogram per workspace and per server). The call
log writer adds every batch to them in the batch's transaction (gateway/db/tool_calls.py);
rebuild() recomputes them from the raw rows instead, for data that did not come through the
writer (a bulk COPY, a restore). Both run roll_up(), so they cannot disagree.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gateway.db.types import Connection


def floor_hour(moment: datetime) -> datetime:
    """The start of the UTC hour holding `moment` (a rollup row's `hour`)."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(moment: datetime) -> datetime:
    floor = floor_hour(moment)
    return floor if floor == moment else floor + timedelta(hours=1)


TABLES = ("tool_call_hourly", "tool_call_caller_hourly", "latency_hourly")

# Adds the calls of tool_calls matching {where} to every rollup table. First one row per
# (workspace, server, tool, hour, latency bucket) with GROUP BY, then one per rollup key with
# its histogram built from those (histogram_of): a few million groups for 10M calls, and no
# function call per call (latency_bucket() is inlined). date_bin gives the UTC hour three times
# cheaper than date_trunc('hour', created_at, 'UTC'). Keys are upserted in key order, so two
# gateway processes writing the same hours cannot deadlock. `calls` is read twice (the caller
# counts need no buckets): a second index scan of a batch's ids, rather than setting 10 million
# rows aside during a rebuild. The result is the number of rollup rows inserted or updated.
_ROLL_UP = """
WITH calls AS NOT MATERIALIZED (
    SELECT workspace_id, server_id, tool_name, caller_agent, status, duration_ms,
           date_bin('1 hour', created_at, '2000-01-01 00:00:00+00') AS hour
    FROM tool_calls
    WHERE {where}
),
by_bucket AS MATERIALIZED (
    SELECT workspace_id, server_id, tool_name, hour,
           latency_bucket(duration_ms) AS bucket,
           count(*) AS calls,
           count(*) FILTER (WHERE status = 'error') AS errors,
           count(duration_ms) AS timed,
           coalesce(sum(duration_ms), 0) AS duration_sum
    FROM calls
    GROUP BY 1, 2, 3, 4, 5
),
per_tool AS (
    INSERT INTO tool_call_hourly AS h (workspace_id, server_id, tool_name, hour, call_count,
                                      error_count, duration_count, duration_sum_ms,
                                      latency_histogram)
    SELECT workspace_id, server_id, tool_name, hour,
           sum(calls)::bigint, sum(errors)::bigint, sum(timed)::bigint, sum(duration_sum)::bigint,
           coalesce(histogram_of(array_agg(bucket) FILTER (WHERE bucket IS NOT NULL),
                                 array_agg(calls) FILTER (WHERE bucket IS NOT NULL)), '{{}}')
    FROM by_bucket
    GROUP BY workspace_id, tool_name, server_id, hour
    ORDER BY workspace_id, tool_name, server_id, hour
    ON CONFLICT (workspace_id, tool_name, server_id, hour) DO UPDATE SET
        call_count = h.call_count + excluded.call_count,
        error_count = h.error_count + excluded.error_count,
        duration_count = h.duration_count + excluded.duration_count,
        duration_sum_ms = h.duration_sum_ms + excluded.duration_sum_ms,
        latency_histogram = histogram_add(h.latency_histogram, excluded.latency_histogram)
    RETURNING 1
),
per_caller AS (
    INSERT INTO tool_call_caller_hourly AS c (workspace_id, caller_agent, tool_name, server_id,
                                             hour, call_count, error_count)
    SELECT workspace_id, caller_agent, tool_name, server_id, hour,
           count(*), count(*) FILTER (WHERE status = 'error')
    FROM calls
    WHERE caller_agent IS NOT NULL
    GROUP BY workspace_id, caller_agent, tool_name, server_id, hour
    ORDER BY workspace_id, caller_agent, tool_name, server_id, hour
    ON CONFLICT (workspace_id, caller_agent, tool_name, server_id, hour) DO UPDATE SET
        call_count = c.call_count + excluded.call_count,
        error_count = c.error_count + excluded.error_count
    RETURNING 1
),
per_scope AS (
    INSERT INTO latency_hourly AS l (scope, workspace_id, hour, latency_histogram)
    SELECT s.scope, b.workspace_id, b.hour, histogram_of(array_agg(b.bucket), array_agg(b.calls))
    FROM by_bucket AS b
    CROSS JOIN LATERAL (VALUES (b.workspace_id), (b.server_id)) AS s (scope)
    WHERE b.bucket IS NOT NULL
    GROUP BY s.scope, b.workspace_id, b.hour
    ORDER BY s.scope, b.hour
    ON CONFLICT (scope, hour) DO UPDATE SET
        latency_histogram = histogram_add(l.latency_histogram, excluded.latency_histogram)
    RETURNING 1
)
SELECT (SELECT count(*) FROM per_tool) + (SELECT count(*) FROM per_caller)
       + (SELECT count(*) FROM per_scope)
"""


def roll_up(where: str) -> str:
    """The statement adding the tool_calls rows matching `where` (SQL, with $n parameters)
    to every rollup table."""
    return _ROLL_UP.format(where=where)


# Writers (their roll-up statement upserts every rollup table) wait while a rebuild runs;
# readers do not. Taken before the rebuild reads tool_calls, so every committed call is in what
# it reads and no call commits until the new rollups do. The tables are locked in the order in
# which a server's delete reaches them (the foreign key cascades into the first two, then the
# trigger delete_server_latency()), so a server deleted meanwhile waits instead of deadlocking.
_LOCK = f"LOCK TABLE {', '.join(TABLES)} IN SHARE ROW EXCLUSIVE MODE"

# {table}, then {scope}: empty (every workspace) or "AND workspace_id = $1".
_DELETE = "DELETE FROM {table} WHERE true {scope}"

# The hash aggregates of roll_up() want memory: they spill to disk beyond work_mem.
_WORK_MEM = "SET LOCAL work_mem = '256MB'"


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """Rows of all rollup tables."""

    deleted: int
    inserted: int


def _count(status: str) -> int:
    """The row count of a command tag such as 'DELETE 42'."""
    return int(status.rsplit(" ", 1)[1])


async def rebuild(conn: Connection, workspace_id: uuid.UUID | None = None) -> Rebuilt:
    """Replace the rollups (of one workspace, or all) with ones computed from tool_calls."""
    scope = "" if workspace_id is None else "AND workspace_id = $1"
    args = () if workspace_id is None else (workspace_id,)
    async with conn.transaction():
        await conn.execute(_LOCK)
        await conn.execute(_WORK_MEM)
        deleted = 0
        for table in TABLES:
            deleted += _count(await conn.execute(_DELETE.format(table=table, scope=scope), *args))
        inserted: int = await conn.fetchval(roll_up(f"true {scope}"), *args)
    return Rebuilt(deleted=deleted, inserted=inserted)
