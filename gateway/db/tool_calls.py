"""SQL for the tool call log: the batched write with its hourly rollups, and the filtered list."""

from __future__ import annotations

import operator
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from gateway.db import partitions, rollups
from gateway.db.rollups import ceil_hour, floor_hour
from gateway.db.types import BIGINT_MAX, Connection, Executor, like_pattern

# The order of a ToolCall record (gateway.calllog.writer) and of the COPY.
COLUMNS = (
    "id",
    "workspace_id",
    "server_id",
    "tool_name",
    "caller_agent",
    "status",
    "duration_ms",
    "input_tokens",
    "output_tokens",
    "output_size_bytes",
    "error_message",
    "created_at",
    "toolset_id",
    "trace_id",
)
# Where a record holds the fields the batch write reads (records are plain tuples here).
_ID_INDEX = COLUMNS.index("id")
_WORKSPACE_INDEX = COLUMNS.index("workspace_id")
_SERVER_INDEX = COLUMNS.index("server_id")
_CREATED_AT_INDEX = COLUMNS.index("created_at")

# The batch's workspaces, then its servers, locked until commit (FOR KEY SHARE). A server
# deleted meanwhile is simply absent (its rows are skipped), and one cannot be deleted before
# the batch commits (the delete then removes the rows too: delete_server_calls() in schema.sql).
# This replaces a foreign key, whose per-row check cost more than the lock does once per batch.
# The workspaces come first, in the order a workspace delete takes them (its row, then its
# servers by cascade): latency_hourly's foreign key would otherwise take the workspace row at
# the upsert, while a delete holding it waits for our servers, a deadlock.
_LOCK_WORKSPACES = "SELECT FROM workspaces WHERE id = ANY($1::uuid[]) ORDER BY id FOR KEY SHARE"
_LOCK_SERVERS = """
SELECT id, workspace_id FROM servers WHERE id = ANY($1::uuid[]) ORDER BY id FOR KEY SHARE
"""

# Only for a retried batch: an earlier attempt may have committed without our hearing of it.
# The batch's time range lets PostgreSQL look only in the partitions of its days (usually one)
# instead of probing the key of every day kept.
_STORED_IDS = """
SELECT id FROM tool_calls WHERE id = ANY($1::uuid[]) AND created_at BETWEEN $2 AND $3
"""


async def write_batch(
    conn: Connection, records: Sequence[tuple[Any, ...]], *, retry: bool = True
) -> int:
    """Store records (in COLUMNS order) and their rollups in one transaction; returns how many
    were new (rows of deleted servers are skipped, and with `retry` rows already stored)."""
    try:
        return await _write_batch(conn, records, retry=retry)
    except asyncpg.CheckViolationError as exc:
        if not str(exc).startswith(_NO_PARTITION):
            raise
    # Partitions are made days ahead (gateway/db/partitions.py), so this is a deployment whose
    # maintenance did not run: rather than lose the calls, their days get partitions now. The
    # rows are the proxy's (now) or ingested ones checked against the retention.
    await partitions.create_days(
        conn, {partitions.floor_day(r[_CREATED_AT_INDEX]) for r in records}
    )
    return await _write_batch(conn, records, retry=retry)


# PostgreSQL's words when no partition of tool_calls takes a row's created_at.
_NO_PARTITION = 'no partition of relation "tool_calls" found for row'


async def _write_batch(conn: Connection, records: Sequence[tuple[Any, ...]], *, retry: bool) -> int:
    async with conn.transaction():
        # Compared as UUID.int: hashing a stdlib UUID per row is slow.
        workspaces = {r[_WORKSPACE_INDEX].int: r[_WORKSPACE_INDEX] for r in records}
        await conn.execute(_LOCK_WORKSPACES, list(workspaces.values()))
        ids = {r[_SERVER_INDEX].int: r[_SERVER_INDEX] for r in records}
        locked = await conn.fetch(_LOCK_SERVERS, list(ids.values()))
        servers = {r["id"].int: r["workspace_id"].int for r in locked}
        rows = [r for r in records if servers.get(r[_SERVER_INDEX].int) == r[_WORKSPACE_INDEX].int]
        if retry and rows:
            found = await conn.fetch(_STORED_IDS, list(map(_ID, rows)), *_time_range(rows))
            stored = {r["id"] for r in found}
            rows = [r for r in rows if r[_ID_INDEX] not in stored]
        if not rows:
            return 0
        await conn.copy_records_to_table("tool_calls", records=rows, columns=COLUMNS)
        await rollups.add_batch(conn, list(map(_ID, rows)), *_time_range(rows))
    return len(rows)


# A record's id and created_at, at C speed.
_ID = operator.itemgetter(_ID_INDEX)
_CREATED_AT = operator.itemgetter(_CREATED_AT_INDEX)


def _time_range(records: Sequence[tuple[Any, ...]]) -> tuple[datetime, datetime]:
    times = list(map(_CREATED_AT, records))
    return min(times), max(times)


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Filters:
    server_id: uuid.UUID | None = None
    # Case-insensitive substring of the tool name.
    tool_name: str | None = None
    caller_agent: str | None = None
    status: str | None = None
    # True: refusals only (see REFUSED); False: every call but them.
    refused: bool | None = None
    # Only the calls that came through this toolset.
    toolset_id: uuid.UUID | None = None
    # Both bounds inclusive.
    start: datetime | None = None
    end: datetime | None = None


# A call the rules stopped before forwarding it (gateway.policy). Literal, not a parameter: so
# the planner matches it with the predicate of the partial index tool_calls_refused_idx.
REFUSED = "status = 'error' AND error_message LIKE 'refused:%'"
# NULL error messages make the plain negation NULL: those calls are not refusals.
_NOT_REFUSED = f"NOT coalesce({REFUSED}, false)"

_ITEM_COLUMNS = """
c.id, c.server_id, s.name AS server_name, c.tool_name, c.caller_agent, c.status, c.duration_ms,
c.input_tokens, c.output_tokens, c.output_size_bytes, c.error_message, c.created_at, c.toolset_id,
c.trace_id
"""

_NEWEST_FIRST = "ORDER BY created_at DESC, id DESC"

# Tool names come from the rollups (a few rows per tool and hour, not one per call), so a
# substring filter turns into equality on the (workspace, tool, time) index. Only the hours of
# the time range: the rollups reach back much further than the calls still listed.
_MATCHING_TOOLS = """
SELECT DISTINCT tool_name FROM tool_call_hourly
WHERE workspace_id = $1 AND tool_name ILIKE $2 ESCAPE '\\' {hours}
"""


class _Sql:
    """Positional parameters for a statement assembled from optional conditions."""

    def __init__(self) -> None:
        self.args: list[Any] = []

    def param(self, value: Any) -> str:
        self.args.append(value)
        return f"${len(self.args)}"


def _raw_conditions(
    sql: _Sql, workspace: str, filters: Filters, tools: str | None, refused: bool | None
) -> list[str]:
    conditions = [f"workspace_id = {workspace}"]
    if filters.server_id is not None:
        conditions.append(f"server_id = {sql.param(filters.server_id)}")
    if tools is not None:
        conditions.append(f"tool_name = {tools}")
    if filters.caller_agent is not None:
        conditions.append(f"caller_agent = {sql.param(filters.caller_agent)}")
    if filters.status is not None:
        conditions.append(f"status = {sql.param(filters.status)}")
    if filters.toolset_id is not None:
        conditions.append(f"toolset_id = {sql.param(filters.toolset_id)}")
    if refused is not None:
        conditions.append(REFUSED if refused else _NOT_REFUSED)
    return conditions


async def _matching_tools(
    db: Executor, workspace_id: uuid.UUID, filters: Filters, substring: str
) -> list[str]:
    """The workspace's tool names containing `substring` (any case) in the filters' hours."""
    sql = _Sql()
    sql.args = [workspace_id, like_pattern(substring)]
    hours = ""
    if filters.start is not None:
        hours += f" AND hour >= {sql.param(floor_hour(filters.start))}"
    if filters.end is not None:
        hours += f" AND hour <= {sql.param(filters.end)}"
    rows = await db.fetch(_MATCHING_TOOLS.format(hours=hours), *sql.args)
    return [row["tool_name"] for row in rows]


async def list_tool_calls(
    db: Executor, workspace_id: uuid.UUID, filters: Filters, limit: int, offset: int
) -> dict[str, Any]:
    """{"items": newest first, "total": exact count of every matching call}."""
    tool_names: list[str] | None = None
    if filters.tool_name is not None:
        tool_names = await _matching_tools(db, workspace_id, filters, filters.tool_name)
        if not tool_names:
            return {"items": [], "total": 0}
    items = await _items(db, workspace_id, filters, tool_names, limit, offset)
    if offset == 0 and len(items) < limit:
        total = len(items)  # the page holds everything
    else:
        total = await _count(db, workspace_id, filters, tool_names)
    return {"items": items, "total": total}


async def _items(
    db: Executor,
    workspace_id: uuid.UUID,
    filters: Filters,
    tool_names: list[str] | None,
    limit: int,
    offset: int,
) -> list[dict[str, Any]]:
    sql = _Sql()
    workspace = sql.param(workspace_id)
    several = tool_names is not None and len(tool_names) > 1
    tools = None
    if tool_names is not None:
        tools = "n.name" if several else sql.param(tool_names[0])
    conditions = _raw_conditions(sql, workspace, filters, tools, filters.refused)
    if filters.start is not None:
        conditions.append(f"created_at >= {sql.param(filters.start)}")
    if filters.end is not None:
        conditions.append(f"created_at <= {sql.param(filters.end)}")
    where = " AND ".join(conditions)
    limit_p, offset_p = sql.param(limit), sql.param(offset)
    if several:
        # One ordered index scan per matching tool, merged: never a sort of all their calls.
        names = sql.param(tool_names)
        page = f"""
            SELECT per_tool.* FROM unnest({names}::text[]) AS n (name)
            CROSS JOIN LATERAL (
                SELECT * FROM tool_calls WHERE {where} {_NEWEST_FIRST}
                LIMIT {sql.param(min(limit + offset, BIGINT_MAX))}
            ) AS per_tool
            {_NEWEST_FIRST} LIMIT {limit_p} OFFSET {offset_p}
        """
    else:
        page = (
            f"SELECT * FROM tool_calls WHERE {where} {_NEWEST_FIRST} "
            f"LIMIT {limit_p} OFFSET {offset_p}"
        )
    statement = f"""
        SELECT {_ITEM_COLUMNS} FROM ({page}) AS c JOIN servers AS s ON s.id = c.server_id
        ORDER BY c.created_at DESC, c.id DESC
    """
    return [dict(row) for row in await db.fetch(statement, *sql.args)]


async def _count(
    db: Executor, workspace_id: uuid.UUID, filters: Filters, tool_names: list[str] | None
) -> int:
    """Exact, without counting millions of rows: whole hours come from the rollups (written in
    the same transactions as the calls; tool_call_caller_hourly for a caller_agent filter; both
    keep the toolset apart), only the partial hours at the edges of the range are counted row by
    row. The rollups know nothing of refusals: those are counted row by row over the whole
    range, on their partial index (few beside the calls), and taken from the rollups' count for
    `refused` false."""
    sql = _Sql()
    workspace = sql.param(workspace_id)
    tools = None if tool_names is None else f"ANY({sql.param(tool_names)}::text[])"
    raw_where: list[str] = []

    def raw_count(
        low: datetime | None, high: datetime | None, high_inclusive: bool, refused: bool = False
    ) -> str:
        if refused:
            where = _raw_conditions(sql, workspace, filters, tools, True)
        else:
            if not raw_where:  # parameters only for statements that use them
                raw_where.extend(_raw_conditions(sql, workspace, filters, tools, None))
            where = list(raw_where)
        if low is not None:
            where.append(f"created_at >= {sql.param(low)}")
        if high is not None:
            where.append(f"created_at {'<=' if high_inclusive else '<'} {sql.param(high)}")
        return f"(SELECT count(*) FROM tool_calls WHERE {' AND '.join(where)})"

    start, end = filters.start, filters.end
    refusals = ""
    if filters.refused is not None:
        refusals = raw_count(start, end, True, refused=True)
        if filters.refused:
            total: int = await db.fetchval(f"SELECT {refusals}::bigint", *sql.args)
            return total
    first_full = None if start is None else ceil_hour(start)
    after_full = None if end is None else floor_hour(end)
    if first_full is not None and after_full is not None and first_full > after_full:
        parts = [raw_count(start, end, True)]  # within one hour
    else:
        table = "tool_call_hourly"
        rollup = [f"workspace_id = {workspace}"]
        if filters.caller_agent is not None:
            table = "tool_call_caller_hourly"
            rollup.append(f"caller_agent = {sql.param(filters.caller_agent)}")
        if filters.server_id is not None:
            rollup.append(f"server_id = {sql.param(filters.server_id)}")
        if filters.toolset_id is not None:
            rollup.append(f"toolset_id = {sql.param(filters.toolset_id)}")
        if tools is not None:
            rollup.append(f"tool_name = {tools}")
        if first_full is not None:
            rollup.append(f"hour >= {sql.param(first_full)}")
        if after_full is not None:
            rollup.append(f"hour < {sql.param(after_full)}")
        counted = {
            None: "call_count",
            "error": "error_count",
            "success": "call_count - error_count",
        }[filters.status]
        parts = [f"(SELECT coalesce(sum({counted}), 0) FROM {table} WHERE {' AND '.join(rollup)})"]
        if start is not None and first_full is not None and start < first_full:
            parts.append(raw_count(start, first_full, False))
        if end is not None:
            parts.append(raw_count(after_full, end, True))
    every = f"({' + '.join(parts)})"
    counted_sql = f"{every} - {refusals}" if refusals else every
    total = await db.fetchval(f"SELECT ({counted_sql})::bigint", *sql.args)
    return total


# The id does not say which day's partition holds the call: this probes the key (id,
# created_at) of each day kept, a few buffers each (~0.3 ms for 33 days).
_GET = f"""
SELECT {_ITEM_COLUMNS} FROM tool_calls AS c JOIN servers AS s ON s.id = c.server_id
WHERE c.id = $1 AND c.workspace_id = $2
"""


async def get_tool_call(
    db: Executor, workspace_id: uuid.UUID, call_id: uuid.UUID
) -> dict[str, Any] | None:
    """One call of the workspace (None for another workspace's: it does not exist for you)."""
    row = await db.fetchrow(_GET, call_id, workspace_id)
    return None if row is None else dict(row)


async def server_names(db: Executor, server_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    rows = await db.fetch("SELECT id, name FROM servers WHERE id = ANY($1)", list(server_ids))
    return {row["id"]: row["name"] for row in rows}
