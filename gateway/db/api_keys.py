"""SQL for API keys; only their hashes are stored. A workspace holds a bounded number."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.db.bounds import make_room
from gateway.db.types import Connection, Executor


@dataclass(frozen=True, slots=True)
class ActiveKey:
    id: uuid.UUID
    workspace_id: uuid.UUID


_COLUMNS = "id, name, prefix, created_at, last_used_at, created_by"

_FIND_ACTIVE = "SELECT id, workspace_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL"

# Its creator is a member when it is made.
_INSERT = f"""
INSERT INTO api_keys (workspace_id, name, prefix, key_hash, created_by)
VALUES ($1, $2, $3, $4, $5) RETURNING {_COLUMNS}, false AS created_by_former_member
"""

# Keys belong to the workspace and outlive their creator's membership; but whoever made one
# saw its raw value, so a key whose creator left (or whose account is gone) says so.
_LIST = f"""
SELECT {_COLUMNS},
       created_by IS NULL OR NOT EXISTS (
           SELECT 1 FROM memberships m
           WHERE m.workspace_id = k.workspace_id AND m.user_id = k.created_by
       ) AS created_by_former_member
FROM api_keys k WHERE workspace_id = $1 AND revoked_at IS NULL
ORDER BY created_at DESC
"""

_COUNT_ACTIVE = "SELECT count(*) FROM api_keys WHERE workspace_id = $1 AND revoked_at IS NULL"

_REVOKE = """
UPDATE api_keys SET revoked_at = now()
WHERE id = $1 AND workspace_id = $2 AND revoked_at IS NULL RETURNING key_hash
"""

# Only moves forward, so an older batch from another process never overwrites a newer use.
_TOUCH = """
UPDATE api_keys k SET last_used_at = u.used_at
FROM unnest($1::uuid[], $2::timestamptz[]) AS u (id, used_at)
WHERE k.id = u.id AND (k.last_used_at IS NULL OR k.last_used_at < u.used_at)
"""


async def find_active(db: Executor, key_hash: str) -> ActiveKey | None:
    row = await db.fetchrow(_FIND_ACTIVE, key_hash)
    return None if row is None else ActiveKey(row["id"], row["workspace_id"])


async def insert(
    conn: Connection,
    workspace_id: uuid.UUID,
    name: str,
    prefix: str,
    key_hash: str,
    created_by: uuid.UUID,
    limit: int,
) -> dict[str, Any]:
    """A new key, unless the workspace already holds `limit` active ones (AtBound)."""
    async with conn.transaction():
        await make_room(conn, workspace_id, _COUNT_ACTIVE, limit)
        row = await conn.fetchrow(_INSERT, workspace_id, name, prefix, key_hash, created_by)
    assert row is not None
    return dict(row)


async def list_active(db: Executor, workspace_id: uuid.UUID) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetch(_LIST, workspace_id)]


async def revoke(db: Executor, workspace_id: uuid.UUID, key_id: uuid.UUID) -> str | None:
    """The revoked key's hash, or None if there was no such active key."""
    key_hash: str | None = await db.fetchval(_REVOKE, key_id, workspace_id)
    return key_hash


async def touch(db: Executor, usage: dict[uuid.UUID, float]) -> None:
    ids = list(usage)
    times = [datetime.fromtimestamp(usage[i], UTC) for i in ids]
    await db.execute(_TOUCH, ids, times)
