"""SQL for the server registry: the API's reads and writes, the prober's claims, key rotation."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.db.types import Connection, Executor


@dataclass(frozen=True, slots=True)
class UpstreamRow:
    """What the proxy and the MCP client need to reach a server (credentials still sealed)."""

    id: uuid.UUID
    workspace_id: uuid.UUID
    name: str
    url: str
    auth_type: str | None
    credentials: bytes | None


@dataclass(frozen=True, slots=True)
class ServerChanges:
    """A PATCH: None leaves a field as it is.

    With `set_auth`, auth_type and credentials are both replaced (None clears them); without
    it, `credentials` (when given) replaces those of the current auth_type.
    """

    name: str | None = None
    url: str | None = None
    description: str | None = None
    tags: list[str] | None = None
    set_auth: bool = False
    auth_type: str | None = None
    credentials: bytes | None = None


@dataclass(frozen=True, slots=True)
class SealedCredentials:
    id: uuid.UUID
    credentials: bytes


_COLUMNS = """
id, name, url, description, tags, auth_type, credentials IS NOT NULL AS has_credentials,
status, last_checked_at, last_latency_ms, tool_count, tools_changed_at, created_at, updated_at
"""

_UPSTREAM = """
SELECT id, workspace_id, name, url, auth_type, credentials FROM servers WHERE id = $1
"""

_INSERT = f"""
INSERT INTO servers (workspace_id, name, url, description, tags, auth_type, credentials)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING {_COLUMNS}
"""

_GET = f"SELECT {_COLUMNS} FROM servers WHERE id = $1 AND workspace_id = $2"

# Filters are added only when given (see list_servers), so every variant gets its own plan.
_LIST = f"SELECT {_COLUMNS} FROM servers WHERE workspace_id = $1"
_LIST_STATUS = " AND status = ${n}"
_LIST_TAG = " AND ${n} = ANY (tags)"
_LIST_SEARCH = " AND (name ILIKE ${n} OR description ILIKE ${n} OR url ILIKE ${n})"
_LIST_ORDER = " ORDER BY name"

_LOCK_AUTH_TYPE = """
SELECT auth_type FROM servers WHERE id = $1 AND workspace_id = $2 FOR NO KEY UPDATE
"""

_UPDATE = f"""
UPDATE servers SET
    name = coalesce($3, name),
    url = coalesce($4, url),
    description = coalesce($5, description),
    tags = coalesce($6, tags),
    auth_type = CASE WHEN $7 THEN $8 ELSE auth_type END,
    credentials = CASE WHEN $7 THEN $9 ELSE coalesce($9, credentials) END,
    -- A new address or new credentials deserve a probe now rather than an interval later.
    next_probe_at = CASE WHEN coalesce($4, url) <> url OR $7 OR $9 IS NOT NULL
                         THEN now() ELSE next_probe_at END,
    updated_at = now()
WHERE id = $1 AND workspace_id = $2
RETURNING {_COLUMNS}
"""

# Health checks go with the server (ON DELETE CASCADE in schema.sql).
_DELETE = "DELETE FROM servers WHERE id = $1 AND workspace_id = $2 RETURNING id"

# Claiming pushes next_probe_at one interval (plus up to 10% jitter, so servers registered
# together drift apart) into the future in the same statement that picks the rows; SKIP LOCKED
# lets another gateway process claim other due servers meanwhile instead of waiting. NO KEY:
# servers held by call log batches or a rollup rebuild (FOR KEY SHARE) are still claimed.
_CLAIM_DUE = """
UPDATE servers s
SET next_probe_at = now() + make_interval(secs => $2::float8 * (1 + 0.1 * random()))
FROM (
    SELECT id FROM servers WHERE next_probe_at <= now()
    ORDER BY next_probe_at LIMIT $1
    FOR NO KEY UPDATE SKIP LOCKED
) due
WHERE s.id = due.id
RETURNING s.id, s.workspace_id, s.name, s.url, s.auth_type, s.credentials
"""

_SEALED_PAGE = """
SELECT id, credentials FROM servers
WHERE credentials IS NOT NULL AND id > $1
ORDER BY id LIMIT $2
"""

# Only where the stored token is still the one that was re-encrypted: a PATCH that changed
# the credentials meanwhile wins.
_RESEAL = """
UPDATE servers s SET credentials = u.resealed
FROM unnest($1::uuid[], $2::bytea[], $3::bytea[]) AS u (id, sealed, resealed)
WHERE s.id = u.id AND s.credentials = u.sealed
"""


def _like_pattern(text: str) -> str:
    """A case-insensitive substring pattern in which % and _ match only themselves."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def upstream(db: Executor, server_id: uuid.UUID) -> UpstreamRow | None:
    row = await db.fetchrow(_UPSTREAM, server_id)
    return None if row is None else UpstreamRow(**dict(row))


async def create(
    db: Executor,
    workspace_id: uuid.UUID,
    *,
    name: str,
    url: str,
    description: str,
    tags: list[str],
    auth_type: str | None,
    credentials: bytes | None,
) -> dict[str, Any]:
    row = await db.fetchrow(
        _INSERT, workspace_id, name, url, description, tags, auth_type, credentials
    )
    assert row is not None
    return dict(row)


async def get(db: Executor, workspace_id: uuid.UUID, server_id: uuid.UUID) -> dict[str, Any] | None:
    row = await db.fetchrow(_GET, server_id, workspace_id)
    return None if row is None else dict(row)


async def list_servers(
    db: Executor,
    workspace_id: uuid.UUID,
    *,
    status: str | None = None,
    tag: str | None = None,
    search: str | None = None,
) -> list[dict[str, Any]]:
    sql = _LIST
    args: list[Any] = [workspace_id]
    for fragment, value in (
        (_LIST_STATUS, status),
        (_LIST_TAG, tag),
        (_LIST_SEARCH, None if search is None else _like_pattern(search)),
    ):
        if value is not None:
            args.append(value)
            sql += fragment.format(n=len(args))
    return [dict(r) for r in await db.fetch(sql + _LIST_ORDER, *args)]


async def lock_auth_type(
    conn: Connection, workspace_id: uuid.UUID, server_id: uuid.UUID
) -> tuple[bool, str | None]:
    """(found, auth_type), with the row locked until the transaction ends."""
    row = await conn.fetchrow(_LOCK_AUTH_TYPE, server_id, workspace_id)
    return (False, None) if row is None else (True, row["auth_type"])


async def update(
    db: Executor, workspace_id: uuid.UUID, server_id: uuid.UUID, changes: ServerChanges
) -> dict[str, Any] | None:
    row = await db.fetchrow(
        _UPDATE,
        server_id,
        workspace_id,
        changes.name,
        changes.url,
        changes.description,
        changes.tags,
        changes.set_auth,
        changes.auth_type,
        changes.credentials,
    )
    return None if row is None else dict(row)


async def delete(db: Executor, workspace_id: uuid.UUID, server_id: uuid.UUID) -> bool:
    return await db.fetchval(_DELETE, server_id, workspace_id) is not None


async def claim_due(db: Executor, limit: int, interval_seconds: float) -> list[UpstreamRow]:
    """Servers whose probe is due, now rescheduled one interval ahead (for every process)."""
    rows = await db.fetch(_CLAIM_DUE, limit, interval_seconds)
    return [UpstreamRow(**dict(r)) for r in rows]


async def sealed_credentials_page(
    db: Executor, after: uuid.UUID, limit: int
) -> list[SealedCredentials]:
    """Stored credentials in id order, after `after` (keyset pagination)."""
    rows = await db.fetch(_SEALED_PAGE, after, limit)
    return [SealedCredentials(r["id"], r["credentials"]) for r in rows]


async def reseal(db: Executor, replacements: Sequence[tuple[SealedCredentials, bytes]]) -> int:
    """Store re-encrypted credentials; returns how many rows still held the old token."""
    if not replacements:
        return 0
    status = await db.execute(
        _RESEAL,
        [old.id for old, _ in replacements],
        [old.credentials for old, _ in replacements],
        [new for _, new in replacements],
    )
    return int(status.rsplit(" ", 1)[1])
