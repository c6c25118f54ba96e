"""SQL for workspaces, always seen through the caller's membership (their role)."""

from __future__ import annotations

import re
import secrets
import uuid
from typing import Any

from gateway.db import users as users_db
from gateway.db.bounds import AtBound
from gateway.db.types import Connection, Executor

_COLUMNS = "w.id, w.name, w.slug, w.is_personal, w.created_at, m.role"

_INSERT = """
WITH w AS (
    INSERT INTO workspaces (name, slug, is_personal) VALUES ($1, $2, $3)
    RETURNING id, name, slug, is_personal, created_at
), m AS (
    INSERT INTO memberships (workspace_id, user_id, role) SELECT id, $4, 'owner' FROM w
    RETURNING role
)
SELECT w.id, w.name, w.slug, w.is_personal, w.created_at, m.role FROM w, m
"""

_GET = f"""
SELECT {_COLUMNS} FROM workspaces w
JOIN memberships m ON m.workspace_id = w.id AND m.user_id = $2
WHERE w.id = $1
"""

_LIST = f"""
SELECT {_COLUMNS} FROM workspaces w
JOIN memberships m ON m.workspace_id = w.id AND m.user_id = $1
ORDER BY w.is_personal DESC, w.created_at, w.name
"""

_PERSONAL = f"""
SELECT {_COLUMNS} FROM workspaces w
JOIN memberships m ON m.workspace_id = w.id AND m.user_id = $1
WHERE w.is_personal AND m.role = 'owner'
ORDER BY w.created_at LIMIT 1
"""

_UPDATE = f"""
WITH w AS (
    UPDATE workspaces SET name = coalesce($3, name), slug = coalesce($4, slug)
    WHERE id = $1 RETURNING id, name, slug, is_personal, created_at
)
SELECT {_COLUMNS} FROM w JOIN memberships m ON m.workspace_id = w.id AND m.user_id = $2
"""

_DELETE = "DELETE FROM workspaces WHERE id = $1 AND NOT is_personal RETURNING id"

_SLUG_TAKEN = "SELECT EXISTS (SELECT 1 FROM workspaces WHERE slug = $1)"

_COUNT_FOR_USER = "SELECT count(*) FROM memberships WHERE user_id = $1"


def slugify(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:50] or "workspace"
    return slug if len(slug) >= 2 else f"{slug}-ws"


async def free_slug(db: Executor, name: str) -> str:
    """A slug derived from the name, with a random suffix if the plain one is taken."""
    base = slugify(name)
    if not await db.fetchval(_SLUG_TAKEN, base):
        return base
    return f"{base}-{secrets.token_hex(3)}"


async def create(
    conn: Connection,
    owner_id: uuid.UUID,
    name: str,
    slug: str | None,
    *,
    personal: bool,
    limit: int | None = None,
) -> dict[str, Any]:
    """A workspace owned by owner_id, in the caller's transaction; without `slug`, one derived
    from the name. With `limit`, refused (AtBound) when the owner already belongs to that many
    workspaces; the owner's row is locked first, so creations at once count each other (and
    derive their slugs one after the other)."""
    if limit is not None:
        await users_db.lock(conn, owner_id)
        if await conn.fetchval(_COUNT_FOR_USER, owner_id) >= limit:
            raise AtBound
    slug = slug or await free_slug(conn, name)
    row = await conn.fetchrow(_INSERT, name, slug, personal, owner_id)
    assert row is not None
    return dict(row)


async def get(db: Executor, workspace_id: uuid.UUID, user_id: uuid.UUID) -> dict[str, Any] | None:
    row = await db.fetchrow(_GET, workspace_id, user_id)
    return None if row is None else dict(row)


async def list_for_user(db: Executor, user_id: uuid.UUID) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetch(_LIST, user_id)]


async def personal(db: Executor, user_id: uuid.UUID) -> dict[str, Any] | None:
    row = await db.fetchrow(_PERSONAL, user_id)
    return None if row is None else dict(row)


async def update(
    db: Executor, workspace_id: uuid.UUID, user_id: uuid.UUID, name: str | None, slug: str | None
) -> dict[str, Any] | None:
    row = await db.fetchrow(_UPDATE, workspace_id, user_id, name, slug)
    return None if row is None else dict(row)


async def delete(db: Executor, workspace_id: uuid.UUID) -> bool:
    """False for a personal workspace, which cannot be deleted."""
    return await db.fetchval(_DELETE, workspace_id) is not None
