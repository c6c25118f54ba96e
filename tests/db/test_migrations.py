"""An existing database migrated to the newest version equals a fresh one made from schema.sql.

schema_v1.sql is the schema as first released (version 1), kept frozen here: every migration
since must take a database of that version, with data in it, to exactly what schema.sql makes.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from gateway.calllog import ToolCall
from gateway.db import tool_calls
from gateway.db.rollups import TABLES
from gateway.db.schema import apply_schema, migrations
from tests.conftest import scratch_database

V1 = Path(__file__).with_name("schema_v1.sql")

# Every object of the public schema, described by PostgreSQL itself: columns, constraints,
# indexes, functions (aggregates by their state function), triggers.
_CATALOG = """
SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' '
       || is_nullable || ' ' || coalesce(column_default, '')
FROM information_schema.columns WHERE table_schema = 'public'
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'public'::regnamespace
UNION ALL
SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'public'
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


def some_calls(workspace_id: uuid.UUID, servers: list[uuid.UUID]) -> list[ToolCall]:
    """Calls over a few hours, servers, tools and callers; some untimed, some failed."""
    start = datetime(2026, 11, 1, 9, 15, tzinfo=UTC)
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
            for table in TABLES:
                assert await rows_of(old, table) == await rows_of(db, table), table
        finally:
            await old.close()
