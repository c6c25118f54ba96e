"""An existing database migrated to the newest version equals a fresh one made from schema.sql.

schema_v1.sql is the schema as first released (version 1), kept frozen here: every migration
since must take a database of that version, with data in it, to exactly what schema.sql makes.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from gateway.calllog.records import ToolCall
from gateway.db import tool_calls
from gateway.db.partitions import AHEAD_DAYS, DEFAULT_KEEP_DAYS, floor_day, partitions
from gateway.db.rollups import TABLES, rebuild
from gateway.db.schema import apply_schema, migrations
from tests.helpers.postgres import scratch_database

V1 = Path(__file__).with_name("schema_v1.sql")

# Every object of the public schema, described by PostgreSQL itself: columns, constraints,
# indexes, functions (aggregates by their state function), triggers, how tables are
# partitioned. Partitions themselves (of tool_calls: one per day) depend on the data and the
# day; test_partitions_cover_the_old_calls_and_the_coming_days checks them.
_CATALOG = """
WITH partitions AS (SELECT oid, relname FROM pg_class WHERE relispartition)
SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' '
       || is_nullable || ' ' || coalesce(column_default, '')
FROM information_schema.columns
WHERE table_schema = 'public' AND table_name NOT IN (SELECT relname FROM partitions)
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
FROM pg_constraint
WHERE connamespace = 'public'::regnamespace AND conrelid NOT IN (SELECT oid FROM partitions)
UNION ALL
SELECT 'index ' || indexdef FROM pg_indexes
WHERE schemaname = 'public' AND tablename NOT IN (SELECT relname FROM partitions)
UNION ALL
SELECT 'partitioned ' || partrelid::regclass || ' ' || pg_get_partkeydef(partrelid)
FROM pg_partitioned_table
UNION ALL
SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') '
       || CASE WHEN p.prokind = 'a' THEN 'aggregate of ' || a.aggtransfn::text
               ELSE pg_get_functiondef(p.oid) END
FROM pg_proc AS p LEFT JOIN pg_aggregate AS a ON a.aggfnoid = p.oid
WHERE p.pronamespace = 'public'::regnamespace
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal
"""


async def catalog(conn: asyncpg.Connection) -> list[str]:
    return sorted(row[0] for row in await conn.fetch(_CATALOG))


async def rows_of(conn: asyncpg.Connection, table: str) -> list[tuple[object, ...]]:
    return sorted(tuple(row) for row in await conn.fetch(f"SELECT * FROM {table}"))


def some_calls(
    workspace_id: uuid.UUID, servers: list[uuid.UUID], start: datetime | None = None
) -> list[ToolCall]:
    """Calls over a few hours, servers, tools and callers; some untimed, some failed. By
    default from three days ago: days that the newest schema keeps."""
    if start is None:
        start = floor_day(datetime.now(UTC)) - timedelta(days=3) + timedelta(hours=9, minutes=15)
    return [
        ToolCall(
            id=uuid.uuid4(),
            workspace_id=workspace_id,
            server_id=servers[i % len(servers)],
            tool_name=f"tool-{i % 3}",
            caller_agent=None if i % 4 == 0 else f"agent-{i % 2}",
            status="error" if i % 5 == 0 else "success",
            duration_ms=None if i % 7 == 0 else 3 + i * 11,
            input_tokens=None,
            output_tokens=None,
            output_size_bytes=100,
            error_message=None,
            created_at=start + timedelta(minutes=17 * i),
        )
        for i in range(60)
    ]


async def test_the_first_schema_with_data_migrates_to_what_schema_sql_makes(
    pg_admin_dsn: str, db: asyncpg.Connection
) -> None:
    assert migrations(), "no migrations yet: nothing to check"
    workspace_id = uuid.uuid4()
    servers = [uuid.uuid4(), uuid.uuid4()]
    calls = some_calls(workspace_id, servers)
    async with scratch_database(pg_admin_dsn, "gw_v1") as url:
        old = await asyncpg.connect(url)
        try:
            await old.execute(V1.read_text())
            for conn in (old, db):
                await conn.execute(
                    "INSERT INTO workspaces (id, name, slug) VALUES ($1, 'W', 'w')", workspace_id
                )
                await conn.executemany(
                    "INSERT INTO servers (id, workspace_id, name, url) VALUES ($1, $2, $3, 'http://x')",
                    [(s, workspace_id, f"s{n}") for n, s in enumerate(servers)],
                )
            # The fresh database gets the calls through the writer, which keeps every rollup;
            # the old one gets the same calls and the rollup it had then, tool_call_hourly.
            assert await tool_calls.write_batch(db, calls) == len(calls)
            for table in ("tool_calls", "tool_call_hourly"):
                rows = [tuple(row) for row in await db.fetch(f"TABLE {table}")]
                await old.copy_records_to_table(table, records=rows)

            assert await apply_schema(old) == max(number for number, _ in migrations())

            assert await catalog(old) == await catalog(db)
            for table in ("tool_calls", *TABLES):
                assert await rows_of(old, table) == await rows_of(db, table), table
        finally:
            await old.close()


@contextlib.asynccontextmanager
async def upgrade(pg_admin_dsn: str, calls: list[ToolCall]) -> AsyncIterator[asyncpg.Connection]:
    """A database of version 4 holding `calls` (and their servers), migrated to the newest."""
    async with scratch_database(pg_admin_dsn, "gw_v4") as url:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(V1.read_text())
            for number, sql in migrations():
                if number <= 4:
                    await conn.execute(sql)
            await conn.execute("INSERT INTO schema_version (version) VALUES (4)")
            workspaces = {c.workspace_id for c in calls}
            for workspace_id in workspaces:
                await conn.execute(
                    "INSERT INTO workspaces (id, name, slug) VALUES ($1, 'W', $2)",
                    workspace_id,
                    workspace_id.hex,
                )
            await conn.executemany(
                "INSERT INTO servers (id, workspace_id, name, url) VALUES ($1, $2, $3, 'http://x')",
                list({(c.server_id, c.workspace_id, c.server_id.hex) for c in calls}),
            )
            await conn.copy_records_to_table("tool_calls", records=calls)
            yield conn
        finally:
            await conn.close()


async def test_the_old_table_becomes_the_first_partition_not_rewritten(
    pg_admin_dsn: str,
) -> None:
    workspace_id = uuid.uuid4()
    servers = [uuid.uuid4(), uuid.uuid4()]
    today = floor_day(datetime.now(UTC))
    # A year of calls, and one a client dated far ahead (nothing refused that before).
    calls = some_calls(workspace_id, servers, today - timedelta(days=365))
    calls += some_calls(workspace_id, servers, today)[:5]
    ahead = some_calls(workspace_id, servers, today + timedelta(days=9))[0]
    calls.append(ahead)
    async with upgrade(pg_admin_dsn, calls) as conn:
        file_of = "SELECT relfilenode FROM pg_class WHERE relname = $1"
        before = await conn.fetchval(file_of, "tool_calls")
        assert await apply_schema(conn) == max(number for number, _ in migrations())
        found = await partitions(conn)
        first = found[0]
        # Everything before the day after the newest call, in the same file as before.
        assert first.name == f"tool_calls_before_{today + timedelta(days=10):%Y%m%d}"
        assert (first.start, first.end) == (None, today + timedelta(days=10))
        assert await conn.fetchval(file_of, first.name) == before
        assert [p.name for p in found[1:]] == []  # the coming days are inside it
        stored = await conn.fetch("SELECT id, tableoid::regclass::text AS part FROM tool_calls")
        assert sorted(r["id"] for r in stored) == sorted(c.id for c in calls)
        assert {r["part"] for r in stored} == {first.name}
        # The rollups of the old calls are recomputed from them: nothing was dropped yet.
        rebuilt = await rebuild(conn)
        assert rebuilt.inserted > 0
        # New calls are written, and the primary key still refuses one twice.
        new = some_calls(workspace_id, servers, today + timedelta(hours=1))[:3]
        assert await tool_calls.write_batch(conn, new) == 3
        assert await tool_calls.write_batch(conn, new) == 0


async def test_an_empty_old_table_is_dropped_for_day_partitions(pg_admin_dsn: str) -> None:
    async with upgrade(pg_admin_dsn, []) as conn:
        await apply_schema(conn)
        today = floor_day(datetime.now(UTC))
        found = await partitions(conn)
        assert [p.start for p in found] == [
            today - timedelta(days=days) for days in range(DEFAULT_KEEP_DAYS, -AHEAD_DAYS - 1, -1)
        ]
        assert all(p.attached and not p.detaching for p in found)
