"""SQL for API keys; only their hashes are stored. A workspace holds a bounded number.

Each key also holds its rules (governed access): permissions, allowed servers and tools, a
rate limit. Changing them notifies every process (schema.sql's trigger), which reloads the key.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.db.bounds import make_room
from gateway.db.types import Connection, Executor


@dataclass(frozen=True, slots=True)
class ActiveKey:
    id: uuid.UUID
    workspace_id: uuid.UUID
    permissions: list[str]
    allowed_servers: list[uuid.UUID] | None
    allowed_tools: list[str] | None
    rate_limit: str | None


@dataclass(frozen=True, slots=True)
class KeyRules:
    """A key's governed-access fields, as a create or a PATCH gives them."""

    permissions: list[str]
    allowed_servers: list[uuid.UUID] | None
    allowed_tools: list[str] | None
    rate_limit: str | None


class UnknownServers(Exception):
    """allowed_servers names ids that are not servers of the key's workspace."""

    def __init__(self, ids: list[uuid.UUID]) -> None:
        super().__init__(", ".join(map(str, ids)))
        self.ids = ids


_RULES = "permissions, allowed_servers, allowed_tools, rate_limit"
_COLUMNS = f"id, name, prefix, created_at, last_used_at, created_by, {_RULES}"

_FIND_ACTIVE = f"""
SELECT id, workspace_id, {_RULES} FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL
"""

# Its creator is a member when it is made.
_INSERT = f"""
INSERT INTO api_keys (workspace_id, name, prefix, key_hash, created_by, {_RULES})
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING {_COLUMNS}, false AS created_by_former_member
"""

# The ids of $2 that are servers of the workspace (locked against deletion until the key is
# written: a server deleted meanwhile would stay in the list).
_EXISTING_SERVERS = """
SELECT id FROM servers WHERE workspace_id = $1 AND id = ANY($2::uuid[]) FOR KEY SHARE
"""

_UPDATE_RULES = f"""
UPDATE api_keys k SET permissions = $3, allowed_servers = $4, allowed_tools = $5, rate_limit = $6,
    name = coalesce($7, name)
WHERE id = $1 AND workspace_id = $2 AND revoked_at IS NULL
RETURNING {_COLUMNS}, key_hash,
       created_by IS NULL OR NOT EXISTS (
           SELECT 1 FROM memberships m
           WHERE m.workspace_id = k.workspace_id AND m.user_id = k.created_by
       ) AS created_by_former_member
"""

_GET_RULES = f"""
SELECT {_RULES} FROM api_keys WHERE id = $1 AND workspace_id = $2 AND revoked_at IS NULL
"""
_LOCK_RULES = _GET_RULES + " FOR UPDATE"

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
    if row is None:
        return None
    return ActiveKey(
        row["id"],
        row["workspace_id"],
        row["permissions"],
        row["allowed_servers"],
        row["allowed_tools"],
        row["rate_limit"],
    )


async def insert(
    conn: Connection,
    workspace_id: uuid.UUID,
    name: str,
    prefix: str,
    key_hash: str,
    created_by: uuid.UUID,
    rules: KeyRules,
    limit: int,
) -> dict[str, Any]:
    """A new key, unless the workspace already holds `limit` active ones (AtBound), or
    `allowed_servers` names what is not a server of the workspace (UnknownServers)."""
    async with conn.transaction():
        await make_room(conn, workspace_id, _COUNT_ACTIVE, limit)
        await _check_servers(conn, workspace_id, rules.allowed_servers)
        row = await conn.fetchrow(
            _INSERT,
            workspace_id,
            name,
            prefix,
            key_hash,
            created_by,
            rules.permissions,
            rules.allowed_servers,
            rules.allowed_tools,
            rules.rate_limit,
        )
    assert row is not None
    return dict(row)


async def rules_of(db: Executor, workspace_id: uuid.UUID, key_id: uuid.UUID) -> KeyRules | None:
    """The active key's rules, or None when there is no such key."""
    row = await db.fetchrow(_GET_RULES, key_id, workspace_id)
    return None if row is None else KeyRules(**dict(row))


async def update_rules(
    conn: Connection,
    workspace_id: uuid.UUID,
    key_id: uuid.UUID,
    change: Callable[[KeyRules], KeyRules],
    *,
    name: str | None = None,
) -> dict[str, Any] | None:
    """Replace an active key's rules with change(its current rules), under a row lock so two
    PATCHes of different fields both land: the key as listed, plus its `key_hash` (for the
    caller to drop from its cache); None when there is no such key, UnknownServers as for
    insert()."""
    async with conn.transaction():
        row = await conn.fetchrow(_LOCK_RULES, key_id, workspace_id)
        if row is None:
            return None
        rules = change(KeyRules(**dict(row)))
        await _check_servers(conn, workspace_id, rules.allowed_servers)
        row = await conn.fetchrow(
            _UPDATE_RULES,
            key_id,
            workspace_id,
            rules.permissions,
            rules.allowed_servers,
            rules.allowed_tools,
            rules.rate_limit,
            name,
        )
    return None if row is None else dict(row)


async def _check_servers(
    conn: Connection, workspace_id: uuid.UUID, server_ids: list[uuid.UUID] | None
) -> None:
    if not server_ids:
        return
    found = {r["id"] for r in await conn.fetch(_EXISTING_SERVERS, workspace_id, server_ids)}
    unknown = [i for i in server_ids if i not in found]
    if unknown:
        raise UnknownServers(unknown)


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
