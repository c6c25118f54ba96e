"""SQL for OAuth grants as the protected resources use them: the grant behind a token, the
grants a person or a workspace has given (the dashboard's "Connected apps"), revoking one, and
when each was last used (written in batches). Codes, clients and refresh tokens are in
gateway/db/oauth.py."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.db.types import Executor


@dataclass(frozen=True, slots=True)
class ActiveGrant:
    """What a token's grant says about it: who consented, where, for which URL, and to which
    client (its name as consented to)."""

    id: uuid.UUID
    workspace_id: uuid.UUID
    user_id: uuid.UUID
    client_name: str
    resource: str


_FIND = """
SELECT id, workspace_id, user_id, client_name, resource FROM oauth_grants WHERE id = $1
"""

# One row of "Connected apps": the grant, its workspace, the server or toolset it opens (by
# name: the URL alone says little), and the member who consented.
_LISTED = """
SELECT g.id, g.client_id, g.client_name, g.resource, g.workspace_id, w.name AS workspace_name,
       g.server_id, g.toolset_id, COALESCE(s.name, t.name) AS target_name, g.user_id,
       u.name AS user_name, u.email AS user_email, g.created_at, g.last_used_at
FROM oauth_grants g
JOIN workspaces w ON w.id = g.workspace_id
JOIN users u ON u.id = g.user_id
LEFT JOIN servers s ON s.id = g.server_id
LEFT JOIN toolsets t ON t.id = g.toolset_id
"""

_FOR_USER = _LISTED + "WHERE g.user_id = $1 ORDER BY g.created_at DESC, g.id"
_FOR_WORKSPACE = _LISTED + "WHERE g.workspace_id = $1 ORDER BY g.created_at DESC, g.id"

# Its member may revoke a grant, and so may an admin or owner of its workspace; anyone else
# finds nothing (the same answer as for a grant that is not there). In one statement, so a
# role changed meanwhile is seen.
_DELETE = """
DELETE FROM oauth_grants g
WHERE g.id = $1
  AND (g.user_id = $2 OR EXISTS (
      SELECT 1 FROM memberships m
      WHERE m.workspace_id = g.workspace_id AND m.user_id = $2 AND m.role IN ('admin', 'owner')
  ))
RETURNING g.id
"""

# Never moves last_used_at back: batches from several processes may arrive in any order.
_TOUCH = """
UPDATE oauth_grants g SET last_used_at = u.used_at
FROM unnest($1::uuid[], $2::timestamptz[]) AS u (id, used_at)
WHERE g.id = u.id AND (g.last_used_at IS NULL OR g.last_used_at < u.used_at)
"""


async def find(db: Executor, grant_id: uuid.UUID) -> ActiveGrant | None:
    row = await db.fetchrow(_FIND, grant_id)
    if row is None:
        return None
    return ActiveGrant(
        row["id"], row["workspace_id"], row["user_id"], row["client_name"], row["resource"]
    )


async def list_for_user(db: Executor, user_id: uuid.UUID) -> list[dict[str, Any]]:
    """Every grant the user gave, in every workspace, newest first."""
    return [dict(row) for row in await db.fetch(_FOR_USER, user_id)]


async def list_for_workspace(db: Executor, workspace_id: uuid.UUID) -> list[dict[str, Any]]:
    """Every grant of the workspace's members there, newest first."""
    return [dict(row) for row in await db.fetch(_FOR_WORKSPACE, workspace_id)]


async def delete(db: Executor, grant_id: uuid.UUID, user_id: uuid.UUID) -> bool:
    """Revoke a grant `user_id` may revoke; False when there is none such. Its tokens stop
    working in every process (the table's trigger NOTIFYs)."""
    return await db.fetchval(_DELETE, grant_id, user_id) is not None


async def touch(db: Executor, usage: dict[uuid.UUID, float]) -> None:
    """Record last use (epoch seconds by grant id); grants revoked meanwhile are skipped."""
    ids = list(usage)
    times = [datetime.fromtimestamp(usage[i], UTC) for i in ids]
    await db.execute(_TOUCH, ids, times)
