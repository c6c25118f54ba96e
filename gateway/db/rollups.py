"""The hourly rollups of tool calls: their hours, the one statement that computes them, and
rebuilding them.

Three tables, all keyed by UTC hour: tool_call_hourly (per workspace, server, tool and toolset:
counts, durations and a latency histogram), tool_call_caller_hourly (the same counts per
caller_agent too) and latency_hourly (one merged latency histogram per workspace, per server
and per toolset). The toolset is that of the calls which came through one, null (one value in
the keys) for all others. One statement computes them from raw rows (roll_up()): the call log
writer runs it over each batch it has just inserted, in the batch's transaction (add_batch()),
and rebuild() over every row held, for data that did not come through the writer (a bulk COPY,
a restore).

The rollups outlive the raw calls (retention drops days of tool_calls long before their hours
are pruned here, prune()): a rebuild recomputes only the hours whose calls are all still held.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.db import partitions
from gateway.db.types import Connection, Executor


def floor_hour(moment: datetime) -> datetime:
    """The start of the UTC hour holding `moment` (a rollup row's `hour`)."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(moment: datetime) -> datetime:
    floor = floor_hour(moment)
    return floor if floor == moment else floor + timedelta(hours=1)


TABLES = ("tool_call_hourly", "tool_call_caller_hourly", "latency_hourly")

# Adds the calls of tool_calls matching {where} to every rollup table. First one row per
# (workspace, server, tool, toolset, hour, latency bucket) with GROUP BY, then one per rollup
# key with its histogram built from those (histogram_of): a few million groups for 10M calls,
# and no function call per call (latency_bucket() is inlined). date_bin gives the UTC hour three
# times cheaper than date_trunc('hour', created_at, 'UTC'). Keys are upserted in key order (a
# null toolset last, as in the unique indexes), so concurrent batches never deadlock each other.
# `calls` is scanned twice (the caller counts need no buckets) rather than setting 10 million
# rows aside. A key already there adds the new counts to its own (the aliases h, c and l); a
# null toolset_id matches a null one (NULLS NOT DISTINCT). A call through a toolset adds to
# three latency scopes (workspace, server, toolset), any other to two. The result is the number
# of rollup rows inserted or updated.
_ROLL_UP = """
WITH calls AS NOT MATERIALIZED (
    SELECT workspace_id, server_id, tool_name, toolset_id, caller_agent, status, duration_ms,
           date_bin('1 hour', created_at, '2000-01-01 00:00:00+00') AS hour
    FROM tool_calls
    WHERE {where}
),
by_bucket AS MATERIALIZED (
    SELECT workspace_id, server_id, tool_name, toolset_id, hour,
           latency_bucket(duration_ms) AS bucket,
           count(*) AS calls,
           count(*) FILTER (WHERE status = 'error') AS errors,
           count(duration_ms) AS timed,
           coalesce(sum(duration_ms), 0) AS duration_sum
    FROM calls
    GROUP BY 1, 2, 3, 4, 5, 6
),
per_tool AS (
    INSERT INTO tool_call_hourly AS h (workspace_id, server_id, tool_name, hour, toolset_id,
                                      call_count, error_count, duration_count, duration_sum_ms,
                                      latency_histogram)
    SELECT workspace_id, server_id, tool_name, hour, toolset_id,
           sum(calls)::bigint, sum(errors)::bigint, sum(timed)::bigint, sum(duration_sum)::bigint,
           coalesce(histogram_of(array_agg(bucket) FILTER (WHERE bucket IS NOT NULL),
                                 array_agg(calls) FILTER (WHERE bucket IS NOT NULL)), '{{}}')
    FROM by_bucket
    GROUP BY workspace_id, tool_name, server_id, hour, toolset_id
    ORDER BY workspace_id, tool_name, server_id, hour, toolset_id
    ON CONFLICT (workspace_id, tool_name, server_id, hour, toolset_id) DO UPDATE SET
        call_count = h.call_count + excluded.call_count,
        error_count = h.error_count + excluded.error_count,
        duration_count = h.duration_count + excluded.duration_count,
        duration_sum_ms = h.duration_sum_ms + excluded.duration_sum_ms,
        latency_histogram = histogram_add(h.latency_histogram, excluded.latency_histogram)
    RETURNING 1
),
per_caller AS (
    INSERT INTO tool_call_caller_hourly AS c (workspace_id, caller_agent, tool_name, server_id,
                                             hour, toolset_id, call_count, error_count)
    SELECT workspace_id, caller_agent, tool_name, server_id, hour, toolset_id,
           count(*), count(*) FILTER (WHERE status = 'error')
    FROM calls
    WHERE caller_agent IS NOT NULL
    GROUP BY workspace_id, caller_agent, tool_name, server_id, hour, toolset_id
    ORDER BY workspace_id, caller_agent, tool_name, server_id, hour, toolset_id
    ON CONFLICT (workspace_id, caller_agent, tool_name, server_id, hour, toolset_id)
    DO UPDATE SET
        call_count = c.call_count + excluded.call_count,
        error_count = c.error_count + excluded.error_count
    RETURNING 1
),
per_scope AS (
    INSERT INTO latency_hourly AS l (scope, workspace_id, hour, latency_histogram)
    SELECT s.scope, b.workspace_id, b.hour, histogram_of(array_agg(b.bucket), array_agg(b.calls))
    FROM by_bucket AS b
    CROSS JOIN LATERAL (VALUES (b.workspace_id), (b.server_id), (b.toolset_id)) AS s (scope)
    WHERE b.bucket IS NOT NULL AND s.scope IS NOT NULL
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


# A batch the call log writer has just copied into tool_calls, added to the rollups in the same
# transaction by roll_up() itself, so the writer's rollups and a rebuild's are one computation.
# Its rows are found again by their ids (the primary key) within the batch's time range, which
# keeps PostgreSQL to the partitions of its days; the aggregation is PostgreSQL's work, not the
# gateway's (the gateway's CPU is the proxy's). The tables are locked first, in the order of a
# rebuild's LOCK TABLE (TABLES): the INSERTs would otherwise lock them in their own order and
# deadlock with a rebuild.
_LOCK_FOR_BATCH = f"LOCK TABLE {', '.join(TABLES)} IN ROW EXCLUSIVE MODE"
_ADD_BATCH = roll_up("id = ANY($1::uuid[]) AND created_at BETWEEN $2 AND $3")


async def add_batch(conn: Connection, ids: list[Any], first: datetime, last: datetime) -> None:
    """Add the tool_calls rows just inserted with these ids, created from `first` to `last`,
    to every rollup table (inside the transaction that inserted them)."""
    await conn.execute(_LOCK_FOR_BATCH)
    await conn.execute(_ADD_BATCH, ids, first, last)


# A rebuild first locks its workspaces, then their servers (FOR KEY SHARE, as a call log batch
# does), in the order in which a delete takes them: a workspace or server delete then waits for
# the rebuild instead of holding a row the rebuild's inserts need (their foreign keys) while it
# waits for the tables the rebuild holds, a deadlock. Two cases could still deadlock (PostgreSQL
# then fails one of the two, and it can simply be run again): a server created during the
# rebuild, given calls and deleted before the rebuild ends; and, for a one-workspace rebuild,
# imported rows naming a server of another workspace that is deleted meanwhile. Renaming a
# workspace or server (a key: unique indexes) waits for the rebuild too.
_LOCK_ROWS = {
    "": (
        "SELECT FROM workspaces ORDER BY id FOR KEY SHARE",
        "SELECT FROM servers ORDER BY id FOR KEY SHARE",
    ),
    "AND workspace_id = $1": (
        "SELECT FROM workspaces WHERE id = $1 FOR KEY SHARE",
        "SELECT FROM servers WHERE workspace_id = $1 ORDER BY id FOR KEY SHARE",
    ),
}
# Then writers (they upsert every rollup table) wait while the rebuild runs; readers do not.
# Taken before the rebuild reads tool_calls, so every committed call is in what it reads and no
# call commits until the new rollups do.
_LOCK_TABLES = f"LOCK TABLE {', '.join(TABLES)} IN SHARE ROW EXCLUSIVE MODE"

# Retention may drop days of tool_calls meanwhile: a rebuild first waits for a drop under way
# and then keeps any from starting until it commits (the lock of gateway/db/partitions.py,
# shared: rebuilds do not wait for each other here). Taken before anything else, so a rebuild
# waiting for it holds no lock that writers or a detach would wait for.
_HOLD_PARTITIONS = "SELECT pg_advisory_xact_lock_shared($1)"

# {table}, then {where}: which rows (the workspace's, the hours since the calls are held).
_DELETE = "DELETE FROM {table} WHERE {where}"

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
    """Replace the rollups (of one workspace, or all) with ones computed from tool_calls, for
    the hours whose calls tool_calls still holds in full; older hours are left as they are
    (their calls are gone: recomputing would erase what analytics keep of them)."""
    scope = "" if workspace_id is None else "AND workspace_id = $1"
    args: list[Any] = [] if workspace_id is None else [workspace_id]
    async with conn.transaction():
        await conn.execute(_HOLD_PARTITIONS, partitions.LOCK_KEY)
        for lock in _LOCK_ROWS[scope]:
            await conn.execute(lock, *args)
        await conn.execute(_LOCK_TABLES)
        await conn.execute(_WORK_MEM)
        since = await partitions.complete_since(conn)
        hours, calls = f"true {scope}", f"true {scope}"
        if since is not None:
            args.append(since)
            hours += f" AND hour >= ${len(args)}"
            calls += f" AND created_at >= ${len(args)}"
        deleted = 0
        for table in TABLES:
            deleted += _count(await conn.execute(_DELETE.format(table=table, where=hours), *args))
        inserted: int = await conn.fetchval(roll_up(calls), *args)
    return Rebuilt(deleted=deleted, inserted=inserted)


# One batch of the oldest rollup rows of a table, before $1. SKIP LOCKED: a row a writer or a
# server delete holds is left for the next round instead of waited for (no deadlock with the
# delete's trigger, which locks latency_hourly rows in its own order).
_PRUNE = """
DELETE FROM {table} WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {table} WHERE hour < $1 ORDER BY hour LIMIT $2 FOR UPDATE SKIP LOCKED
))
"""


async def prune(db: Executor, table: str, before: datetime, limit: int) -> int:
    """Delete up to `limit` rows of a rollup table (one of TABLES) for hours before `before`;
    returns how many. Nothing reads hours that old (the caller keeps those of the raw calls'
    retention, which list totals use, and 30 days for analytics), so an hour pruned from one
    table and not yet from another (a workspace's latency histogram and not yet its servers')
    is never seen."""
    assert table in TABLES, table
    return _count(await db.execute(_PRUNE.format(table=table), before, limit))
