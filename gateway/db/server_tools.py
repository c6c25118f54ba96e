"""SQL for tool integrity: each server's tools as last seen, their approvals, the change history.

A list that differs from the last one is diffed under the server's row lock, so two processes
recording at once record each change once. The first list of a server is where its history
starts: it records no changes. A pinned server's cached upstream (gateway/upstreams/servers)
carries the names of its approved tools, so every write that can change them notifies the
servers' invalidation channel.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import asyncpg

from gateway.db.types import Connection, Executor

# The change history a server keeps; older changes go first.
MAX_CHANGES_PER_SERVER: Final = 1000

_DIGEST = "SELECT tool_definitions_hash FROM servers WHERE id = $1"

_LOCK = """
SELECT workspace_id, pin_tools, tool_definitions_hash FROM servers WHERE id = $1
FOR NO KEY UPDATE
"""

# Fingerprints only: definitions stay in the database (a definition may be large).
_CURRENT = """
SELECT name, fingerprint FROM server_tools WHERE server_id = $1 AND fingerprint IS NOT NULL
"""

# Tools seen (new or changed): stored as current, approvals kept. Definitions arrive as text.
_UPSERT = """
INSERT INTO server_tools AS t (server_id, name, fingerprint, definition, seen_at)
SELECT $1, u.name, u.fingerprint, u.definition::jsonb, now()
FROM unnest($2::text[], $3::text[], $4::text[]) AS u (name, fingerprint, definition)
ON CONFLICT (server_id, name) DO UPDATE SET
    fingerprint = excluded.fingerprint, definition = excluded.definition, seen_at = now()
"""

# Tools gone: forgotten, unless approved (then kept, so that they come back approved only as
# they were).
_GONE = """
WITH gone AS (
    DELETE FROM server_tools WHERE server_id = $1 AND name = ANY ($2::text[]) AND approved IS NULL
)
UPDATE server_tools SET fingerprint = NULL, definition = NULL, seen_at = now()
WHERE server_id = $1 AND name = ANY ($2::text[]) AND approved IS NOT NULL
"""

# Before the tools are updated: `before` is the definition stored until now.
_CHANGES = """
INSERT INTO tool_changes (server_id, workspace_id, tool_name, change, before, after)
SELECT $1, $2, c.name, c.change, t.definition, c.after::jsonb
FROM unnest($3::text[], $4::text[], $5::text[]) WITH ORDINALITY AS c (name, change, after, n)
LEFT JOIN server_tools t ON t.server_id = $1 AND t.name = c.name
ORDER BY c.n
"""

_KEEP_NEWEST = """
DELETE FROM tool_changes WHERE id IN (
    SELECT id FROM tool_changes WHERE server_id = $1
    ORDER BY detected_at DESC, id DESC OFFSET $2
)
"""

_SET_DIGEST = "UPDATE servers SET tool_definitions_hash = $2 WHERE id = $1"

_NOTIFY = "SELECT pg_notify('gateway_invalidate', 'servers:' || $1::uuid::text)"

_APPROVE_ALL = """
WITH gone AS (DELETE FROM server_tools WHERE server_id = $1 AND fingerprint IS NULL)
UPDATE server_tools SET approved = fingerprint
WHERE server_id = $1 AND fingerprint IS NOT NULL
"""

_APPROVE = """
UPDATE server_tools SET approved = fingerprint
WHERE server_id = $1 AND name = ANY ($2::text[]) AND fingerprint IS NOT NULL
RETURNING name
"""

_TOOLS = """
SELECT name, definition, fingerprint IS NOT DISTINCT FROM approved AS approved,
       approved IS NOT NULL AS was_approved, seen_at
FROM server_tools WHERE server_id = $1 AND fingerprint IS NOT NULL
ORDER BY name
"""

# Approved tools whose definition is still the approved one: what a pinned server serves.
APPROVED_NAMES: Final = """
ARRAY(SELECT t.name FROM server_tools t
      WHERE t.server_id = servers.id AND t.fingerprint = t.approved)
"""

# How many tools of a pinned server wait for approval (0 when it does not pin them).
TOOLS_WAITING: Final = """
CASE WHEN servers.pin_tools THEN (
    SELECT count(*) FROM server_tools t
    WHERE t.server_id = servers.id AND t.fingerprint IS NOT NULL
      AND t.fingerprint IS DISTINCT FROM t.approved
)::int ELSE 0 END
"""

_LIST = """
SELECT id, server_id, tool_name, change, before, after, detected_at FROM tool_changes
WHERE server_id = $1
ORDER BY detected_at DESC, id DESC LIMIT $2 OFFSET $3
"""

_COUNT = "SELECT count(*) FROM tool_changes WHERE server_id = $1"

_COUNT_IN_WINDOW = """
SELECT server_id, count(*)::float8 AS changes FROM tool_changes
WHERE server_id = ANY ($1::uuid[]) AND detected_at >= $2 AND detected_at <= $3
GROUP BY server_id
"""

_PRUNE = """
DELETE FROM tool_changes WHERE id IN (
    SELECT id FROM tool_changes WHERE detected_at < $1 ORDER BY detected_at LIMIT $2
)
"""


async def current_digest(db: Executor, server_id: uuid.UUID) -> str | None:
    digest: str | None = await db.fetchval(_DIGEST, server_id)
    return digest


async def record(
    pool: asyncpg.Pool,
    server_id: uuid.UUID,
    defined: Mapping[str, bytes],
    fingerprints: Mapping[str, str],
    digest: str,
) -> int:
    """Store a list that differs from the last one (name -> canonical JSON of the definition,
    name -> fingerprint, the list's digest); returns how many changes were recorded (0 if the
    server is gone, or the list turned out to be the same, or it is the server's first)."""
    async with pool.acquire() as conn, conn.transaction():
        server = await conn.fetchrow(_LOCK, server_id)
        if server is None or server["tool_definitions_hash"] == digest:
            return 0
        first = server["tool_definitions_hash"] is None
        before = {row["name"]: row["fingerprint"] for row in await conn.fetch(_CURRENT, server_id)}
        seen = [name for name in defined if before.get(name) != fingerprints[name]]
        gone = [name for name in before if name not in defined]
        changes = 0
        if not first and (seen or gone):
            names = [*seen, *gone]
            kinds = ["changed" if name in before else "added" for name in seen]
            kinds += ["removed"] * len(gone)
            after = [defined[name].decode() for name in seen] + [None] * len(gone)
            await conn.execute(_CHANGES, server_id, server["workspace_id"], names, kinds, after)
            await conn.execute(_KEEP_NEWEST, server_id, MAX_CHANGES_PER_SERVER)
            changes = len(names)
        if seen:
            await conn.execute(
                _UPSERT,
                server_id,
                seen,
                [fingerprints[name] for name in seen],
                [defined[name].decode() for name in seen],
            )
        if gone:
            await conn.execute(_GONE, server_id, gone)
        await conn.execute(_SET_DIGEST, server_id, digest)
        if server["pin_tools"] and (seen or gone):
            await conn.execute(_NOTIFY, server_id)
        return changes


async def approve(
    conn: Connection, server_id: uuid.UUID, names: Sequence[str] | None, *, notify: bool
) -> list[str]:
    """Approve the current definitions of `names` (None: of every tool, and forget the
    approvals of tools gone); returns the names approved (those currently listed)."""
    if names is None:
        await conn.execute(_APPROVE_ALL, server_id)
        approved = [row["name"] for row in await conn.fetch(_TOOLS, server_id)]
    else:
        approved = [row["name"] for row in await conn.fetch(_APPROVE, server_id, list(names))]
    if notify:
        await conn.execute(_NOTIFY, server_id)
    return approved


async def tools(db: Executor, server_id: uuid.UUID) -> list[dict[str, Any]]:
    """The server's current tools in name order: `definition`, `approved` (the current
    definition is the approved one), `was_approved` (some definition was), `seen_at`."""
    return [dict(row) for row in await db.fetch(_TOOLS, server_id)]


async def list_changes(
    db: Executor, server_id: uuid.UUID, limit: int, offset: int
) -> list[dict[str, Any]]:
    return [dict(row) for row in await db.fetch(_LIST, server_id, limit, offset)]


async def count_changes(db: Executor, server_id: uuid.UUID) -> int:
    return int(await db.fetchval(_COUNT, server_id))


async def changes_in_window(
    db: Executor, server_ids: Sequence[uuid.UUID], start: datetime, end: datetime
) -> dict[uuid.UUID, float]:
    """How many tool changes each server had in [start, end]; 0 for those without."""
    values = dict.fromkeys(server_ids, 0.0)
    for row in await db.fetch(_COUNT_IN_WINDOW, list(server_ids), start, end):
        values[row["server_id"]] = row["changes"]
    return values


async def prune(db: Executor, older_than: datetime, batch_size: int) -> int:
    """Delete up to `batch_size` of the oldest changes before `older_than`; returns how many."""
    status = await db.execute(_PRUNE, older_than, batch_size)
    return int(status.rsplit(" ", 1)[1])
