"""The hourly rollups of tool calls: their hours, the one statement that computes them, and
rebuilding them.

Three tables, all keyed by UTC hour: tool_call_hourly (per workspace, server and tool: counts,
durations and a latency histogram), tool_call_caller_hourly (the same counts per caller_agent
too) and latency_hourly (one merged latency histogram per workspace and per server). The call
log writer adds every batch to them in the batch's transaction (add_batch(), which aggregates
the batch in Python); rebuild() recomputes them from the raw rows in SQL instead (roll_up()), for
data that did not come through the writer (a bulk COPY, a restore). The tests check that both
give the same rows.

The rollups outlive the raw calls (retention drops days of tool_calls long before their hours
are pruned here, prune()): a rebuild recomputes only the hours whose calls are all still held.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.db import partitions
from gateway.db.histograms import latency_bucket
from gateway.db.types import Connection, Executor

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_HOUR = timedelta(hours=1)


def floor_hour(moment: datetime) -> datetime:
    """The start of the UTC hour holding `moment` (a rollup row's `hour`)."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(moment: datetime) -> datetime:
    floor = floor_hour(moment)
    return floor if floor == moment else floor + timedelta(hours=1)


TABLES = ("tool_call_hourly", "tool_call_caller_hourly", "latency_hourly")

# How a rollup row takes in more calls; shared by roll_up() and add_batch(). The aliases h, c
# and l are those of the INSERTs.
_ADD_TO_TOOL = """ON CONFLICT (workspace_id, tool_name, server_id, hour) DO UPDATE SET
        call_count = h.call_count + excluded.call_count,
        error_count = h.error_count + excluded.error_count,
        duration_count = h.duration_count + excluded.duration_count,
        duration_sum_ms = h.duration_sum_ms + excluded.duration_sum_ms,
        latency_histogram = histogram_add(h.latency_histogram, excluded.latency_histogram)"""
_ADD_TO_CALLER = """ON CONFLICT (workspace_id, caller_agent, tool_name, server_id, hour)
    DO UPDATE SET
        call_count = c.call_count + excluded.call_count,
        error_count = c.error_count + excluded.error_count"""
_ADD_TO_SCOPE = """ON CONFLICT (scope, hour) DO UPDATE SET
        latency_histogram = histogram_add(l.latency_histogram, excluded.latency_histogram)"""
_ADDS = {
    "add_to_tool": _ADD_TO_TOOL,
    "add_to_caller": _ADD_TO_CALLER,
    "add_to_scope": _ADD_TO_SCOPE,
}

# Adds the calls of tool_calls matching {where} to every rollup table. First one row per
# (workspace, server, tool, hour, latency bucket) with GROUP BY, then one per rollup key with
# its histogram built from those (histogram_of): a few million groups for 10M calls, and no
# function call per call (latency_bucket() is inlined). date_bin gives the UTC hour three times
# cheaper than date_trunc('hour', created_at, 'UTC'). Keys are upserted in key order, as
# add_batch() does. `calls` is scanned twice (the caller counts need no buckets) rather than
# setting 10 million rows aside. The result is the number of rollup rows inserted or updated.
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
    {add_to_tool}
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
    {add_to_caller}
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
    {add_to_scope}
    RETURNING 1
)
SELECT (SELECT count(*) FROM per_tool) + (SELECT count(*) FROM per_caller)
       + (SELECT count(*) FROM per_scope)
"""


def roll_up(where: str) -> str:
    """The statement adding the tool_calls rows matching `where` (SQL, with $n parameters)
    to every rollup table."""
    return _ROLL_UP.format(where=where, **_ADDS)


# A batch's rollups, aggregated by the writer (add_batch()): a few rows per tool and hour rather
# than one per call, so PostgreSQL upserts those instead of reading the batch back. Histograms
# travel as array literals ('{0,2,1}') because a ragged integer[][] cannot. Keys are upserted in
# the same order as roll_up() does, so concurrent writers never deadlock each other. The tables
# are locked first, in the order of a rebuild's LOCK TABLE (TABLES): a prepared statement would
# otherwise lock latency_hourly (the main INSERT) before the others and deadlock with a rebuild.
_LOCK_FOR_BATCH = f"LOCK TABLE {', '.join(TABLES)} IN ROW EXCLUSIVE MODE"
_ADD_BATCH = """
WITH per_tool AS (
    INSERT INTO tool_call_hourly AS h (workspace_id, server_id, tool_name, hour, call_count,
                                      error_count, duration_count, duration_sum_ms,
                                      latency_histogram)
    SELECT u.workspace_id, u.server_id, u.tool_name, u.hour, u.calls, u.errors, u.timed,
           u.duration_sum, u.histogram::integer[]
    FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::timestamptz[], $5::bigint[],
                $6::bigint[], $7::bigint[], $8::bigint[], $9::text[])
         AS u (workspace_id, server_id, tool_name, hour, calls, errors, timed, duration_sum,
               histogram)
    ORDER BY u.workspace_id, u.tool_name, u.server_id, u.hour
    {add_to_tool}
),
per_caller AS (
    INSERT INTO tool_call_caller_hourly AS c (workspace_id, caller_agent, tool_name, server_id,
                                             hour, call_count, error_count)
    SELECT * FROM unnest($10::uuid[], $11::text[], $12::text[], $13::uuid[],
                         $14::timestamptz[], $15::bigint[], $16::bigint[])
                  AS u (workspace_id, caller_agent, tool_name, server_id, hour, calls, errors)
    ORDER BY 1, 2, 3, 4, 5
    {add_to_caller}
)
INSERT INTO latency_hourly AS l (scope, workspace_id, hour, latency_histogram)
SELECT u.scope, u.workspace_id, u.hour, u.histogram::integer[]
FROM unnest($17::uuid[], $18::uuid[], $19::timestamptz[], $20::text[])
     AS u (scope, workspace_id, hour, histogram)
ORDER BY u.scope, u.hour
{add_to_scope}
""".format(**_ADDS)


@dataclass(slots=True)
class _Counts:
    calls: int = 0
    errors: int = 0
    timed: int = 0
    duration_sum: int = 0
    # bucket -> calls
    histogram: dict[int, int] = field(default_factory=dict)


def _literal(histogram: dict[int, int]) -> str:
    """A dense histogram as an integer[] literal, up to its highest bucket ('{}' if empty)."""
    dense = [0] * (max(histogram) + 1) if histogram else []
    for bucket, calls in histogram.items():
        dense[bucket] = calls
    return "{" + ",".join(map(str, dense)) + "}"


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Rows as `width` parallel lists: one array parameter per column for unnest()."""
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[]] * width


async def add_batch(conn: Connection, records: Sequence[tuple[Any, ...]]) -> None:
    """Add records just inserted into tool_calls (in tool_calls.COLUMNS order) to every rollup
    table: the same figures as roll_up() computes from the stored rows (a test checks it)."""
    # Keyed by plain ints (UUID.int, hours since the epoch): hashing a UUID or a datetime per
    # row would cost more than the rest of the loop.
    per_tool: dict[tuple[Any, ...], _Counts] = defaultdict(_Counts)
    per_caller: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0])
    per_scope: dict[tuple[int, int, int], dict[int, int]] = defaultdict(dict)
    for _, workspace, server, tool, caller, status, duration, *_, created_at in records:
        ws, sv, hour = workspace.int, server.int, (created_at - _EPOCH) // _HOUR
        error = status == "error"
        counts = per_tool[ws, sv, tool, hour]
        counts.calls += 1
        counts.errors += error
        if caller is not None:
            by_caller = per_caller[ws, caller, tool, sv, hour]
            by_caller[0] += 1
            by_caller[1] += error
        if duration is not None:
            counts.timed += 1
            counts.duration_sum += duration
            bucket = latency_bucket(duration)
            counts.histogram[bucket] = counts.histogram.get(bucket, 0) + 1
            for scope in (ws, sv):
                histogram = per_scope[scope, ws, hour]
                histogram[bucket] = histogram.get(bucket, 0) + 1
    tools = [
        (
            _uuid(ws),
            _uuid(sv),
            tool,
            _hour(hour),
            c.calls,
            c.errors,
            c.timed,
            c.duration_sum,
            _literal(c.histogram),
        )
        for (ws, sv, tool, hour), c in per_tool.items()
    ]
    callers = [
        (_uuid(ws), caller, tool, _uuid(sv), _hour(hour), calls, errors)
        for (ws, caller, tool, sv, hour), (calls, errors) in per_caller.items()
    ]
    scopes = [
        (_uuid(scope), _uuid(ws), _hour(hour), _literal(histogram))
        for (scope, ws, hour), histogram in per_scope.items()
    ]
    await conn.execute(_LOCK_FOR_BATCH)
    await conn.execute(_ADD_BATCH, *_columns(tools, 9), *_columns(callers, 7), *_columns(scopes, 4))


def _uuid(value: int) -> uuid.UUID:
    return uuid.UUID(int=value)


def _hour(hours_since_epoch: int) -> datetime:
    # Exact timedelta arithmetic both ways: a float timestamp would round far-off instants.
    return _EPOCH + hours_since_epoch * _HOUR


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
