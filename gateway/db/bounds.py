"""Bounds on what one workspace may hold (servers, rules, keys, invitations): counted while the
workspace row is held, so that creations at the same moment count each other."""

from __future__ import annotations

import uuid

from gateway.db.types import Connection

# NO KEY: rows that refer to the workspace (a call log batch, a rollup rebuild, a new row of
# another kind) are not held up by it.
_HOLD_WORKSPACE = "SELECT 1 FROM workspaces WHERE id = $1 FOR NO KEY UPDATE"


class AtBound(Exception):
    """The workspace (or user) already holds as many as it may: nothing was created."""


async def hold_workspace(conn: Connection, workspace_id: uuid.UUID) -> None:
    """Until the caller's transaction ends, whoever else holds the workspace waits."""
    await conn.execute(_HOLD_WORKSPACE, workspace_id)


async def make_room(conn: Connection, workspace_id: uuid.UUID, count_sql: str, limit: int) -> None:
    """Hold the workspace and count what it has (`count_sql` takes its id as $1): AtBound at
    `limit`. In the caller's transaction, before it inserts."""
    await hold_workspace(conn, workspace_id)
    if await conn.fetchval(count_sql, workspace_id) >= limit:
        raise AtBound
