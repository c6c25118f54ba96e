"""SQL for memberships: who belongs to which workspace, with which role."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from typing import Any

import asyncpg

from gateway.db.bounds import hold_workspace
from gateway.db.types import Connection, Executor

_ROLE_OF = "SELECT role FROM memberships WHERE workspace_id = $1 AND user_id = $2"

_ADD = """
INSERT INTO memberships (workspace_id, user_id, role) VALUES ($1, $2, $3)
ON CONFLICT (workspace_id, user_id) DO NOTHING
"""

_MEMBER = """
SELECT u.id AS user_id, u.email, u.name, m.role, m.joined_at
FROM memberships m JOIN users u ON u.id = m.user_id
WHERE m.workspace_id = $1 AND m.user_id = $2
"""

_IS_MEMBER_BY_EMAIL = """
SELECT EXISTS (
    SELECT 1 FROM memberships m JOIN users u ON u.id = m.user_id
    WHERE m.workspace_id = $1 AND u.email = $2
)
"""

_LIST = """
SELECT u.id AS user_id, u.email, u.name, m.role, m.joined_at
FROM memberships m JOIN users u ON u.id = m.user_id
WHERE m.workspace_id = $1
ORDER BY m.joined_at, u.email
"""

# Both guarded statements refuse to leave a workspace without an owner; the row lock on the
# workspace serialises concurrent demotions so two owners cannot demote each other at once.
_OTHER_OWNERS = """
SELECT count(*) FROM memberships WHERE workspace_id = $1 AND role = 'owner' AND user_id <> $2
"""
_SET_ROLE = """
UPDATE memberships SET role = $3 WHERE workspace_id = $1 AND user_id = $2
RETURNING user_id
"""
_REMOVE = "DELETE FROM memberships WHERE workspace_id = $1 AND user_id = $2 RETURNING user_id"


async def role_of(db: Executor, workspace_id: uuid.UUID, user_id: uuid.UUID) -> str | None:
    role: str | None = await db.fetchval(_ROLE_OF, workspace_id, user_id)
    return role


async def add(db: Executor, workspace_id: uuid.UUID, user_id: uuid.UUID, role: str) -> None:
    await db.execute(_ADD, workspace_id, user_id, role)


async def list_members(db: Executor, workspace_id: uuid.UUID) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetch(_LIST, workspace_id)]


async def get_member(
    db: Executor, workspace_id: uuid.UUID, user_id: uuid.UUID
) -> dict[str, Any] | None:
    row = await db.fetchrow(_MEMBER, workspace_id, user_id)
    return None if row is None else dict(row)


async def is_member_by_email(db: Executor, workspace_id: uuid.UUID, email: str) -> bool:
    found: bool = await db.fetchval(_IS_MEMBER_BY_EMAIL, workspace_id, email)
    return found


class LastOwner(Exception):
    """The change would leave the workspace without an owner."""


class Outranked(Exception):
    """The member's role is not one the caller may remove."""


async def _locked_role(conn: Connection, workspace_id: uuid.UUID, user_id: uuid.UUID) -> str | None:
    await hold_workspace(conn, workspace_id)
    return await role_of(conn, workspace_id, user_id)


async def _is_last_owner(
    conn: Connection, workspace_id: uuid.UUID, user_id: uuid.UUID, role: str
) -> bool:
    return role == "owner" and await conn.fetchval(_OTHER_OWNERS, workspace_id, user_id) == 0


async def set_role(
    pool: asyncpg.Pool, workspace_id: uuid.UUID, user_id: uuid.UUID, role: str
) -> bool:
    """False when the user is not a member; LastOwner when demoting the last owner."""
    async with pool.acquire() as conn, conn.transaction():
        current = await _locked_role(conn, workspace_id, user_id)
        if current is None:
            return False
        if role != "owner" and await _is_last_owner(conn, workspace_id, user_id, current):
            raise LastOwner
        return await conn.fetchval(_SET_ROLE, workspace_id, user_id, role) is not None


async def remove(
    pool: asyncpg.Pool,
    workspace_id: uuid.UUID,
    user_id: uuid.UUID,
    removable_roles: Collection[str],
) -> bool:
    """False when the user is not a member; Outranked when their role is not one of
    removable_roles (checked under the lock, so a member promoted meanwhile is safe);
    LastOwner when removing the last owner."""
    async with pool.acquire() as conn, conn.transaction():
        role = await _locked_role(conn, workspace_id, user_id)
        if role is None:
            return False
        if role not in removable_roles:
            raise Outranked
        if await _is_last_owner(conn, workspace_id, user_id, role):
            raise LastOwner
        return await conn.fetchval(_REMOVE, workspace_id, user_id) is not None
