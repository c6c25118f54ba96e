"""SQL for toolsets: the toolset and its member servers, in order."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from gateway.db.types import Executor


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


# Names are unique in a workspace (toolsets_workspace_id_name_key).
_NAMES = "SELECT id, name FROM toolsets WHERE workspace_id = $1 ORDER BY name"


async def names(db: Executor, workspace_id: uuid.UUID) -> list[tuple[uuid.UUID, str]]:
    """The workspace's toolsets as (id, name), by name (the dashboard's toolset filters)."""
    return [(row["id"], row["name"]) for row in await db.fetch(_NAMES, workspace_id)]
