"""SQL for workspace invitations, and the bounds on how many a workspace sends and holds."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from gateway.db.bounds import AtBound, hold_workspace
from gateway.db.types import Connection, Executor
from gateway.security.tokens import hash_token

_COLUMNS = "i.id, i.email, i.role, i.status, i.invited_by, i.created_at, i.expires_at"

_INSERT = """
INSERT INTO invites (id, workspace_id, email, role, token_hash, invited_by, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(days => $7))
RETURNING id, email, role, status, invited_by, created_at, expires_at
"""

_LIST_PENDING = f"""
SELECT {_COLUMNS} FROM invites i
WHERE i.workspace_id = $1 AND i.status = 'pending' AND i.expires_at > now()
ORDER BY i.created_at DESC
"""

_REVOKE = """
UPDATE invites SET status = 'revoked'
WHERE id = $1 AND workspace_id = $2 AND status = 'pending' RETURNING id
"""

_REVOKE_PENDING_FOR_EMAIL = """
UPDATE invites SET status = 'revoked'
WHERE workspace_id = $1 AND email = $2 AND status = 'pending'
"""

_PENDING_FOR_EMAIL = """
SELECT i.id, i.token_hash, i.workspace_id, w.name AS workspace_name, i.role, i.invited_by,
       i.created_at, i.expires_at
FROM invites i JOIN workspaces w ON w.id = i.workspace_id
WHERE i.email = $1 AND i.status = 'pending' AND i.expires_at > now()
ORDER BY i.created_at DESC
"""

# Claiming is one atomic statement, so a token is accepted at most once.
_ACCEPT = """
UPDATE invites SET status = 'accepted', accepted_at = now()
WHERE token_hash = $1 AND status = 'pending' AND expires_at > now()
RETURNING id, workspace_id, email, role
"""

_PENDING_BY_TOKEN = """
SELECT i.id, i.workspace_id, w.name AS workspace_name, i.email, i.role
FROM invites i JOIN workspaces w ON w.id = i.workspace_id
WHERE i.token_hash = $1 AND i.status = 'pending' AND i.expires_at > now()
"""


# Every invitation created in the last hour counts, revoked and replaced ones too: each was an
# email. Of the newest `limit`, the oldest says when the window has room again.
_SENT_LAST_HOUR = """
SELECT count(*) AS sent,
       extract(epoch FROM min(created_at) + interval '1 hour' - clock_timestamp()) AS frees_in
FROM (
    SELECT created_at FROM invites
    WHERE workspace_id = $1 AND created_at > clock_timestamp() - interval '1 hour'
    ORDER BY created_at DESC LIMIT $2
) AS recent
"""

_COUNT_PENDING = """
SELECT count(*) FROM invites
WHERE workspace_id = $1 AND status = 'pending' AND expires_at > now()
"""


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a workspace may do: invitations held pending, and created per hour."""

    max_pending: int
    per_hour: int


class SendingTooFast(Exception):
    """The workspace sent as many invitations as it may this hour."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"retry in {retry_after} s")
        self.retry_after = retry_after


async def replace(
    conn: Connection,
    bounds: Bounds,
    invite_id: uuid.UUID,
    workspace_id: uuid.UUID,
    email: str,
    role: str,
    token_hash: str,
    invited_by: uuid.UUID,
    ttl_days: int,
) -> dict[str, Any]:
    """A new invitation in place of the email's pending one, in the caller's transaction,
    within the workspace's bounds (SendingTooFast, AtBound otherwise)."""
    await hold_workspace(conn, workspace_id)
    recent = await conn.fetchrow(_SENT_LAST_HOUR, workspace_id, bounds.per_hour)
    assert recent is not None
    if recent["sent"] >= bounds.per_hour:
        raise SendingTooFast(max(1, math.ceil(recent["frees_in"])))
    await revoke_pending_for_email(conn, workspace_id, email)
    if await conn.fetchval(_COUNT_PENDING, workspace_id) >= bounds.max_pending:
        raise AtBound
    return await insert(
        conn, invite_id, workspace_id, email, role, token_hash, invited_by, ttl_days
    )


async def insert(
    db: Executor,
    invite_id: uuid.UUID,
    workspace_id: uuid.UUID,
    email: str,
    role: str,
    token_hash: str,
    invited_by: uuid.UUID,
    ttl_days: int,
) -> dict[str, Any]:
    row = await db.fetchrow(
        _INSERT, invite_id, workspace_id, email, role, token_hash, invited_by, ttl_days
    )
    assert row is not None
    return dict(row)


async def list_pending(db: Executor, workspace_id: uuid.UUID) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetch(_LIST_PENDING, workspace_id)]


async def revoke(db: Executor, workspace_id: uuid.UUID, invite_id: uuid.UUID) -> bool:
    return await db.fetchval(_REVOKE, invite_id, workspace_id) is not None


async def revoke_pending_for_email(db: Executor, workspace_id: uuid.UUID, email: str) -> None:
    await db.execute(_REVOKE_PENDING_FOR_EMAIL, workspace_id, email)


async def pending_for_email(db: Executor, email: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetch(_PENDING_FOR_EMAIL, email)]


async def pending_by_token(db: Executor, token: str) -> dict[str, Any] | None:
    row = await db.fetchrow(_PENDING_BY_TOKEN, hash_token(token))
    return None if row is None else dict(row)


async def accept(db: Executor, token: str) -> dict[str, Any] | None:
    row = await db.fetchrow(_ACCEPT, hash_token(token))
    return None if row is None else dict(row)
