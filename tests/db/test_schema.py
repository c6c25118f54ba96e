"""schema.sql applied idempotently with its version recorded, the oldest PostgreSQL it runs on,
and its invalidation triggers."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from asyncpg import ServerVersion

from gateway.db.schema import (
    OLDEST_POSTGRES,
    UnsupportedPostgres,
    apply_schema,
    check_postgres,
    current_version,
    migrations,
)


def latest_version() -> int:
    return max([1, *(number for number, _ in migrations())])


async def test_apply_schema_is_idempotent_safe_to_run_concurrently_and_records_the_version(
    empty_database: str,
) -> None:
    conns = [await asyncpg.connect(empty_database) for _ in range(3)]
    conn = conns[0]
    try:
        assert await current_version(conn) is None
        # Three gateway processes starting at once: one creates, the others wait and find it.
        reached = await asyncio.gather(*(apply_schema(c) for c in conns))
        assert reached == [latest_version()] * 3
        tables = {
            r["tablename"]
            for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
        assert {
            "schema_version",
            "users",
            "workspaces",
            "memberships",
            "invites",
            "refresh_tokens",
            "api_keys",
        } <= tables
        # Again: nothing to do, nothing fails, nothing is recorded twice.
        assert await apply_schema(conn) == latest_version()
        assert await current_version(conn) == latest_version()
        assert await conn.fetchval("SELECT count(*) = count(DISTINCT version) FROM schema_version")
    finally:
        for c in conns:
            await c.close()


async def test_postgres_older_than_15_is_refused_in_words(db: asyncpg.Connection) -> None:
    """The rollups' keys need UNIQUE NULLS NOT DISTINCT (PostgreSQL 15): an older server gets a
    sentence instead of a syntax error in the middle of a migration."""
    assert OLDEST_POSTGRES == 15
    with pytest.raises(
        UnsupportedPostgres, match=r"needs PostgreSQL 15 or later.*is PostgreSQL 14\.12"
    ):
        check_postgres(ServerVersion(14, 12, 0, "final", 0))
    check_postgres(ServerVersion(15, 0, 0, "final", 0))
    check_postgres(db.get_server_version())  # the one the tests run on


async def test_migration_files_are_numbered_in_order() -> None:
    numbers = [number for number, _ in migrations()]
    assert numbers == sorted(set(numbers))
    assert all(number > 1 for number in numbers)  # version 1 is schema.sql itself


async def test_changes_to_cached_rows_are_announced(db: asyncpg.Connection) -> None:
    """Every change a per-request cache may hold is NOTIFYed as '<table>:<key>'."""
    heard: asyncio.Queue[str] = asyncio.Queue()
    await db.add_listener("gateway_invalidate", lambda *args: heard.put_nowait(args[-1]))
    user_id = await db.fetchval(
        "INSERT INTO users (email, name, password_hash) VALUES ('a@x.io', 'A', 'h') RETURNING id"
    )
    workspace_id = await db.fetchval(
        "INSERT INTO workspaces (name, slug) VALUES ('W', 'w-1') RETURNING id"
    )
    membership = f"memberships:{workspace_id}:{user_id}"
    await db.execute(
        "INSERT INTO memberships (workspace_id, user_id, role) VALUES ($1, $2, 'member')",
        workspace_id,
        user_id,
    )
    assert await asyncio.wait_for(heard.get(), 2) == membership
    await db.execute("UPDATE memberships SET role = 'admin'")
    assert await asyncio.wait_for(heard.get(), 2) == membership
    await db.execute(
        "INSERT INTO api_keys (workspace_id, name, prefix, key_hash) VALUES ($1, 'k', 'p', 'h1')",
        workspace_id,
    )
    assert await asyncio.wait_for(heard.get(), 2) == "api_keys:h1"
    # Deleting the workspace cascades, and the cascade is announced too.
    await db.execute("DELETE FROM workspaces WHERE id = $1", workspace_id)
    rest = {await asyncio.wait_for(heard.get(), 2) for _ in range(2)}
    assert rest == {membership, "api_keys:h1"}
