"""Applying schema.sql to a fresh database, or the numbered migrations to an older one."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from importlib import resources

from asyncpg import ServerVersion

from gateway.db import partitions
from gateway.db.types import Connection

log = logging.getLogger(__name__)

# Any constant works; it only has to be the same in every gateway process.
_MIGRATION_LOCK = 0x6D637067  # "mcpg"

_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

# The oldest PostgreSQL the schema runs on: the rollups' keys are UNIQUE NULLS NOT DISTINCT.
OLDEST_POSTGRES = 15


class UnsupportedPostgres(Exception):
    """The database server is older than OLDEST_POSTGRES."""


def check_postgres(version: ServerVersion) -> None:
    """Refuse, in words, a server the schema would fail on with a syntax error."""
    if version.major < OLDEST_POSTGRES:
        raise UnsupportedPostgres(
            f"mcp-gateway needs PostgreSQL {OLDEST_POSTGRES} or later; "
            f"this server is PostgreSQL {version.major}.{version.minor}"
        )


def schema_sql() -> str:
    return resources.files("gateway").joinpath("schema.sql").read_text()


def migrations() -> list[tuple[int, str]]:
    """The numbered migration files, in order: (version, sql)."""
    folder = resources.files("gateway").joinpath("migrations")
    if not folder.is_dir():  # an installed wheel has no folder until a migration exists
        return []
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.read_text()))
    return sorted(found)


async def current_version(conn: Connection) -> int | None:
    exists = await conn.fetchval("SELECT to_regclass('schema_version') IS NOT NULL")
    if not exists:
        return None
    version: int = await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_version")
    return version


async def apply_schema(
    conn: Connection, *, tool_call_retention_days: int = partitions.DEFAULT_KEEP_DAYS
) -> int:
    """Bring the database to the newest schema, idempotently; returns the version reached.

    Also makes the partitions of tool_calls that calls may be written into now (every day
    that `tool_call_retention_days` keeps, and the next ones): before the first write of this
    process, whatever happened to the others meanwhile. An advisory lock makes concurrent
    starts of several gateway processes safe.
    """
    check_postgres(conn.get_server_version())
    await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
    try:
        version = await current_version(conn)
        if version is None:
            async with conn.transaction():
                await conn.execute(schema_sql())
            version = await current_version(conn)
            assert version is not None
            log.info("created schema version %d", version)
        for number, sql in migrations():
            if number <= version:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", number)
            log.info("applied migration %04d", number)
            version = number
        await partitions.create_ahead(conn, datetime.now(UTC), tool_call_retention_days)
        return version
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
