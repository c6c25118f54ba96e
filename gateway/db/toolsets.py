"""SQL for toolsets: the toolset and its member servers, in order."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from gateway.db.bounds import make_room
from gateway.db.types import Connection, Executor


@dataclass(frozen=True, slots=True)
class MemberRow:
    server_id: uuid.UUID
    # Tool name globs; None: every tool.
    tools: list[str] | None
    # None: the default made from the server's name; "": none.
    prefix: str | None


@dataclass(frozen=True, slots=True)
class ToolsetRow:
    """A toolset as its MCP endpoint needs it."""

    id: uuid.UUID
    workspace_id: uuid.UUID
    name: str
    members: tuple[MemberRow, ...]


_TOOLSET = "SELECT id, workspace_id, name FROM toolsets WHERE id = $1"
_MEMBERS = """
SELECT server_id, tools, prefix FROM toolset_servers WHERE toolset_id = $1 ORDER BY position
"""


async def load(db: Executor, toolset_id: uuid.UUID) -> ToolsetRow | None:
    """The toolset with its members in order, or None."""
    row = await db.fetchrow(_TOOLSET, toolset_id)
    if row is None:
        return None
    members = await db.fetch(_MEMBERS, toolset_id)
    return ToolsetRow(
        row["id"],
        row["workspace_id"],
        row["name"],
        tuple(MemberRow(m["server_id"], m["tools"], m["prefix"]) for m in members),
    )


# -- the API's reads and writes ------------------------------------------------------------------


class UnknownServers(Exception):
    """Members name ids that are not servers of the toolset's workspace: nothing was written."""

    def __init__(self, ids: list[uuid.UUID]) -> None:
        super().__init__(", ".join(map(str, ids)))
        self.ids = ids


@dataclass(frozen=True, slots=True)
class ToolsetChanges:
    """A PATCH: None leaves a field as it is; `members`, when given, replaces them all."""

    name: str | None = None
    description: str | None = None
    # Each {server_id, tools, prefix}, in the toolset's order.
    members: list[dict[str, Any]] | None = None


# The members as the API shows them, in order, beside the toolset's own columns.
_COLUMNS = """
t.id, t.name, t.description, t.created_at, t.updated_at,
coalesce(
    (SELECT json_agg(
                json_build_object('server_id', m.server_id, 'tools', m.tools, 'prefix', m.prefix)
                ORDER BY m.position)
     FROM toolset_servers AS m WHERE m.toolset_id = t.id),
    '[]'
) AS servers
"""

_COUNT = "SELECT count(*) FROM toolsets WHERE workspace_id = $1"

_LIST = f"SELECT {_COLUMNS} FROM toolsets AS t WHERE t.workspace_id = $1 ORDER BY t.name, t.id"

_GET = f"SELECT {_COLUMNS} FROM toolsets AS t WHERE t.id = $1 AND t.workspace_id = $2"

_INSERT = "INSERT INTO toolsets (workspace_id, name, description) VALUES ($1, $2, $3) RETURNING id"

# KEY SHARE: a member server cannot be deleted until the toolset's transaction ends (which would
# leave a foreign key violation), yet probes and renames of it go on.
_LOCK_SERVERS = """
SELECT id FROM servers WHERE workspace_id = $1 AND id = ANY($2::uuid[]) FOR KEY SHARE
"""

_LOCK = "SELECT 1 FROM toolsets WHERE id = $1 AND workspace_id = $2 FOR NO KEY UPDATE"

_DROP_MEMBERS = "DELETE FROM toolset_servers WHERE toolset_id = $1"

# The members come as one JSON array, in order: its position is the member's, and `tools` is a
# JSON array (of globs) or null.
_INSERT_MEMBERS = """
INSERT INTO toolset_servers (toolset_id, server_id, position, tools, prefix)
SELECT $1,
       (m.member ->> 'server_id')::uuid,
       m.position - 1,
       CASE WHEN jsonb_typeof(m.member -> 'tools') = 'array' THEN ARRAY(
           SELECT g.glob FROM jsonb_array_elements_text(m.member -> 'tools')
                              WITH ORDINALITY AS g (glob, n)
           ORDER BY g.n
       ) END,
       m.member ->> 'prefix'
FROM jsonb_array_elements($2::jsonb) WITH ORDINALITY AS m (member, position)
"""

_UPDATE = """
UPDATE toolsets SET
    name = coalesce($3, name),
    description = coalesce($4, description),
    updated_at = now()
WHERE id = $1 AND workspace_id = $2
"""

# The members go with it (ON DELETE CASCADE).
_DELETE = "DELETE FROM toolsets WHERE id = $1 AND workspace_id = $2 RETURNING id"


async def list_toolsets(db: Executor, workspace_id: uuid.UUID) -> list[dict[str, Any]]:
    """Every toolset of the workspace with its members, ordered by name."""
    return [dict(r) for r in await db.fetch(_LIST, workspace_id)]


async def get(
    db: Executor, workspace_id: uuid.UUID, toolset_id: uuid.UUID
) -> dict[str, Any] | None:
    row = await db.fetchrow(_GET, toolset_id, workspace_id)
    return None if row is None else dict(row)


async def create(
    conn: Connection,
    workspace_id: uuid.UUID,
    *,
    name: str,
    description: str,
    members: list[dict[str, Any]],
    limit: int,
) -> dict[str, Any]:
    """A new toolset with its members in order, unless the workspace already holds `limit` of
    them (AtBound) or a member is not a server of the workspace (UnknownServers)."""
    async with conn.transaction():
        await make_room(conn, workspace_id, _COUNT, limit)
        await _hold_servers(conn, workspace_id, members)
        toolset_id = await conn.fetchval(_INSERT, workspace_id, name, description)
        await conn.execute(_INSERT_MEMBERS, toolset_id, members)
        created = await get(conn, workspace_id, toolset_id)
    assert created is not None
    return created


async def update(
    conn: Connection, workspace_id: uuid.UUID, toolset_id: uuid.UUID, changes: ToolsetChanges
) -> dict[str, Any] | None:
    """The changed toolset, or None when the workspace has no such toolset; UnknownServers as
    for create()."""
    async with conn.transaction():
        if await conn.fetchval(_LOCK, toolset_id, workspace_id) is None:
            return None
        if changes.members is not None:
            await _hold_servers(conn, workspace_id, changes.members)
            await conn.execute(_DROP_MEMBERS, toolset_id)
            await conn.execute(_INSERT_MEMBERS, toolset_id, changes.members)
        await conn.execute(_UPDATE, toolset_id, workspace_id, changes.name, changes.description)
        return await get(conn, workspace_id, toolset_id)


async def delete(db: Executor, workspace_id: uuid.UUID, toolset_id: uuid.UUID) -> bool:
    return await db.fetchval(_DELETE, toolset_id, workspace_id) is not None


async def _hold_servers(
    conn: Connection, workspace_id: uuid.UUID, members: list[dict[str, Any]]
) -> None:
    """Every member a server of the workspace, kept there until the transaction ends; else
    UnknownServers naming the others, in the members' order."""
    wanted = [member["server_id"] for member in members]
    if not wanted:
        return
    found = {row["id"] for row in await conn.fetch(_LOCK_SERVERS, workspace_id, wanted)}
    unknown = [server_id for server_id in wanted if server_id not in found]
    if unknown:
        raise UnknownServers(unknown)


# Names are unique in a workspace (toolsets_workspace_id_name_key).
_NAMES = "SELECT id, name FROM toolsets WHERE workspace_id = $1 ORDER BY name"


async def names(db: Executor, workspace_id: uuid.UUID) -> list[tuple[uuid.UUID, str]]:
    """The workspace's toolsets as (id, name), by name (the dashboard's toolset filters)."""
    return [(row["id"], row["name"]) for row in await db.fetch(_NAMES, workspace_id)]
