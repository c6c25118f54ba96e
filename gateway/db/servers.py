"""SQL for the server registry: the API's reads and writes, the prober's claims, key rotation."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.db.bounds import make_room
from gateway.db.server_tools import APPROVED_NAMES, TOOLS_WAITING
from gateway.db.types import Connection, Executor, like_pattern


@dataclass(frozen=True, slots=True)
class UpstreamRow:
    """What the proxy and the MCP client need to reach a server (credentials still sealed)."""

    id: uuid.UUID
    workspace_id: uuid.UUID
    name: str
    url: str
    auth_type: str | None
    credentials: bytes | None
    # Governed access; the prober's claims leave them out (None).
    disabled_tools: list[str] | None = None
    rate_limit: str | None = None
    # Tool integrity: None unless the server pins its tools; else the tools whose current
    # definition is the approved one.
    approved_tools: list[str] | None = None


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
    disabled_tools: list[str] | None = None
    # With set_rate_limit, rate_limit replaces the stored one (None removes it).
    set_rate_limit: bool = False
    rate_limit: str | None = None
    pin_tools: bool | None = None


@dataclass(frozen=True, slots=True)
class LockedServer:
    """What a PATCH decides on, read with the row locked until its transaction ends."""

    url: str
    auth_type: str | None
    pin_tools: bool = False


@dataclass(frozen=True, slots=True)
class SealedCredentials:
    id: uuid.UUID
    credentials: bytes


_COLUMNS = f"""
id, name, url, description, tags, auth_type, credentials IS NOT NULL AS has_credentials,
status, last_checked_at, last_latency_ms, tool_count, tools_changed_at, created_at, updated_at,
disabled_tools, rate_limit, pin_tools, {TOOLS_WAITING} AS tools_waiting
"""

_UPSTREAM = f"""
SELECT id, workspace_id, name, url, auth_type, credentials, disabled_tools, rate_limit,
       CASE WHEN pin_tools THEN {APPROVED_NAMES} END AS approved_tools
FROM servers WHERE id = $1
"""

_COUNT = "SELECT count(*) FROM servers WHERE workspace_id = $1"

_INSERT = f"""
INSERT INTO servers (
    workspace_id, name, url, description, tags, auth_type, credentials, disabled_tools, rate_limit,
    pin_tools
)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
RETURNING {_COLUMNS}
"""

_GET = f"SELECT {_COLUMNS} FROM servers WHERE id = $1 AND workspace_id = $2"

# Filters are added only when given (see list_servers), so every variant gets its own plan.
_LIST = f"SELECT {_COLUMNS} FROM servers WHERE workspace_id = $1"
_LIST_STATUS = " AND status = ${n}"
_LIST_TAG = " AND ${n} = ANY (tags)"
_LIST_SEARCH = " AND (name ILIKE ${n} OR description ILIKE ${n} OR url ILIKE ${n})"
# Names are unique within a workspace; the id only keeps pages stable should that ever change.
_LIST_PAGE = " ORDER BY name, id LIMIT ${limit} OFFSET ${offset}"

_LOCK = """
SELECT url, auth_type, pin_tools FROM servers WHERE id = $1 AND workspace_id = $2
FOR NO KEY UPDATE
"""

_UPDATE = f"""
UPDATE servers SET
    name = coalesce($3, name),
    url = coalesce($4, url),
    description = coalesce($5, description),
    tags = coalesce($6, tags),
    auth_type = CASE WHEN $7 THEN $8 ELSE auth_type END,
    credentials = CASE WHEN $7 THEN $9 ELSE coalesce($9, credentials) END,
    disabled_tools = coalesce($10, disabled_tools),
    rate_limit = CASE WHEN $11 THEN $12 ELSE rate_limit END,
    pin_tools = coalesce($13, pin_tools),
    -- A new address or new credentials deserve a probe now rather than an interval later.
    next_probe_at = CASE WHEN coalesce($4, url) <> url OR $7 OR $9 IS NOT NULL
                         THEN now() ELSE next_probe_at END,
    updated_at = now()
WHERE id = $1 AND workspace_id = $2
RETURNING {_COLUMNS}
"""

# Health checks go with the server (ON DELETE CASCADE in schema.sql); keys scoped to it lose
# it from their allowed servers (a key scoped to it alone may then use no server at all, never
# every server).
_DELETE = """
WITH gone AS (DELETE FROM servers WHERE id = $1 AND workspace_id = $2 RETURNING id),
unscoped AS (
    UPDATE api_keys SET allowed_servers = array_remove(allowed_servers, $1)
    WHERE workspace_id = $2 AND $1 = ANY (allowed_servers) AND EXISTS (SELECT 1 FROM gone)
)
SELECT id FROM gone
"""

# The servers whose probe is due, taken in turns between workspaces: every workspace's most
# overdue server first, then every workspace's second, and so on, counting the probes a
# workspace already has in flight in this process ($4, $5), and none past its share ($3). So a
# workspace with a thousand dead servers delays nobody else's probes; its own wait their turn
# and stay due. Claiming pushes next_probe_at one interval (plus up to 10% jitter, so servers
# registered together drift apart) into the future in the same statement that picks the rows;
# SKIP LOCKED lets another gateway process claim the next ones in turn meanwhile instead of
# waiting (the lock is taken in that order, under the LIMIT). NO KEY: servers held by call log
# batches or a rollup rebuild (FOR KEY SHARE) are still claimed.
_CLAIM_DUE = """
WITH in_flight AS (
    SELECT * FROM unnest($4::uuid[], $5::int[]) AS f (workspace_id, probes)
),
turns AS (
    SELECT s.id, s.next_probe_at,
           coalesce(f.probes, 0)
           + row_number() OVER (PARTITION BY s.workspace_id ORDER BY s.next_probe_at, s.id) AS turn
    FROM servers AS s LEFT JOIN in_flight AS f ON f.workspace_id = s.workspace_id
    WHERE s.next_probe_at <= now() AND coalesce(f.probes, 0) < $3
),
due AS (
    SELECT s.id FROM servers AS s JOIN turns AS t ON t.id = s.id
    WHERE t.turn <= $3 AND s.next_probe_at <= now()
    ORDER BY t.turn, t.next_probe_at
    LIMIT $1
    FOR NO KEY UPDATE OF s SKIP LOCKED
)
UPDATE servers AS s
SET next_probe_at = now() + make_interval(secs => $2::float8 * (1 + 0.1 * random()))
FROM due
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


async def upstream(db: Executor, server_id: uuid.UUID) -> UpstreamRow | None:
    row = await db.fetchrow(_UPSTREAM, server_id)
    return None if row is None else UpstreamRow(**dict(row))


async def create(
    conn: Connection,
    workspace_id: uuid.UUID,
    *,
    name: str,
    url: str,
    description: str,
    tags: list[str],
    auth_type: str | None,
    credentials: bytes | None,
    limit: int,
    disabled_tools: list[str] | None = None,
    rate_limit: str | None = None,
    pin_tools: bool = False,
) -> dict[str, Any]:
    """A new server, unless the workspace already holds `limit` of them (AtBound)."""
    async with conn.transaction():
        await make_room(conn, workspace_id, _COUNT, limit)
        row = await conn.fetchrow(
            _INSERT,
            workspace_id,
            name,
            url,
            description,
            tags,
            auth_type,
            credentials,
            disabled_tools or [],
            rate_limit,
            pin_tools,
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
    limit: int,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """One page, ordered by name (then id)."""
    sql = _LIST
    args: list[Any] = [workspace_id]
    for fragment, value in (
        (_LIST_STATUS, status),
        (_LIST_TAG, tag),
        (_LIST_SEARCH, None if search is None else like_pattern(search)),
    ):
        if value is not None:
            args.append(value)
            sql += fragment.format(n=len(args))
    args += [limit, offset]
    sql += _LIST_PAGE.format(limit=len(args) - 1, offset=len(args))
    return [dict(r) for r in await db.fetch(sql, *args)]


async def lock(
    conn: Connection, workspace_id: uuid.UUID, server_id: uuid.UUID
) -> LockedServer | None:
    """The server's url and auth_type, its row locked until the transaction ends; None if the
    workspace has no such server."""
    row = await conn.fetchrow(_LOCK, server_id, workspace_id)
    return None if row is None else LockedServer(row["url"], row["auth_type"], row["pin_tools"])


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
        changes.disabled_tools,
        changes.set_rate_limit,
        changes.rate_limit,
        changes.pin_tools,
    )
    return None if row is None else dict(row)


async def delete(db: Executor, workspace_id: uuid.UUID, server_id: uuid.UUID) -> bool:
    return await db.fetchval(_DELETE, server_id, workspace_id) is not None


async def claim_due(
    db: Executor,
    limit: int,
    interval_seconds: float,
    *,
    per_workspace: int,
    in_flight: Mapping[uuid.UUID, int] | None = None,
) -> list[UpstreamRow]:
    """Up to `limit` servers whose probe is due, taken in turns between workspaces, none of a
    workspace past `per_workspace` counting its probes `in_flight` in this process; they are
    rescheduled one interval ahead (for every process)."""
    busy = dict(in_flight or {})
    rows = await db.fetch(
        _CLAIM_DUE, limit, interval_seconds, per_workspace, list(busy), list(busy.values())
    )
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
