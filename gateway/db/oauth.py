"""SQL for OAuth (gateway/oauth): clients, authorization codes, grants and refresh tokens.

Every check that must hold against a concurrent request is one statement: a code is consumed,
and a refresh token rotated, by an UPDATE that only one of two racing requests can win; the
loser finds the row already used and ends the grant (RFC 9700 4.5 and 4.14.2).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import orjson

from gateway.db.types import Executor

# -- clients ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientRow:
    client_id: str
    client_name: str
    redirect_uris: tuple[str, ...]
    metadata: dict[str, Any]
    registered: bool
    fetched_at: datetime | None


_CLIENT_COLUMNS = "client_id, client_name, redirect_uris, metadata, registered, fetched_at"

_FIND_CLIENT = f"SELECT {_CLIENT_COLUMNS} FROM oauth_clients WHERE client_id = $1"

_INSERT_CLIENT = """
INSERT INTO oauth_clients (client_id, client_name, redirect_uris, metadata, registered)
VALUES ($1, $2, $3, $4::jsonb, true)
"""

# A metadata document, as fetched now. Never over a registered client's row (their ids are
# random tokens, never URLs, but a row of ours is not the document's to change).
_SAVE_DOCUMENT = f"""
INSERT INTO oauth_clients (client_id, client_name, redirect_uris, metadata, registered, fetched_at)
VALUES ($1, $2, $3, $4::jsonb, false, now())
ON CONFLICT (client_id) DO UPDATE
SET client_name = EXCLUDED.client_name, redirect_uris = EXCLUDED.redirect_uris,
    metadata = EXCLUDED.metadata, fetched_at = EXCLUDED.fetched_at
WHERE oauth_clients.registered = false
RETURNING {_CLIENT_COLUMNS}
"""


def _client(row: asyncpg.Record) -> ClientRow:
    metadata = row["metadata"]
    return ClientRow(
        row["client_id"],
        row["client_name"],
        tuple(row["redirect_uris"]),
        orjson.loads(metadata) if isinstance(metadata, str) else dict(metadata),
        row["registered"],
        row["fetched_at"],
    )


async def find_client(db: Executor, client_id: str) -> ClientRow | None:
    row = await db.fetchrow(_FIND_CLIENT, client_id)
    return None if row is None else _client(row)


async def insert_client(
    db: Executor, client_id: str, name: str, redirect_uris: list[str], metadata: dict[str, Any]
) -> None:
    await db.execute(
        _INSERT_CLIENT, client_id, name, redirect_uris, orjson.dumps(metadata).decode()
    )


async def save_document(
    db: Executor, client_id: str, name: str, redirect_uris: list[str], metadata: dict[str, Any]
) -> ClientRow | None:
    """Cache a client ID metadata document; None if the id is a registered client's."""
    row = await db.fetchrow(
        _SAVE_DOCUMENT, client_id, name, redirect_uris, orjson.dumps(metadata).decode()
    )
    return None if row is None else _client(row)


# -- authorization codes ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CodeRow:
    """What a member consented to, as an authorization code carries it to the token
    endpoint."""

    client_id: str
    workspace_id: uuid.UUID
    user_id: uuid.UUID
    resource: str
    server_id: uuid.UUID | None
    toolset_id: uuid.UUID | None
    redirect_uri: str
    scope: str
    code_challenge: str


_CODE_COLUMNS = (
    "client_id, workspace_id, user_id, resource, server_id, toolset_id, redirect_uri, scope, "
    "code_challenge"
)

_INSERT_CODE = """
INSERT INTO oauth_codes (code_hash, client_id, workspace_id, user_id, resource, server_id,
                         toolset_id, redirect_uri, scope, code_challenge, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now() + make_interval(secs => $11))
"""

# Atomic: of two requests presenting one code, only one consumes it.
_CONSUME_CODE = f"""
UPDATE oauth_codes SET used_at = now()
WHERE code_hash = $1 AND client_id = $2 AND used_at IS NULL AND expires_at > now()
RETURNING {_CODE_COLUMNS}
"""

# A code presented again after it was consumed: the code goes, and the grant made from it.
_FORGET_USED_CODE = """
DELETE FROM oauth_codes WHERE code_hash = $1 AND client_id = $2 AND used_at IS NOT NULL
RETURNING grant_id
"""

_DELETE_GRANT = "DELETE FROM oauth_grants WHERE id = $1"


async def insert_code(db: Executor, code_hash: str, code: CodeRow, lifetime_seconds: float) -> None:
    await db.execute(
        _INSERT_CODE,
        code_hash,
        code.client_id,
        code.workspace_id,
        code.user_id,
        code.resource,
        code.server_id,
        code.toolset_id,
        code.redirect_uri,
        code.scope,
        code.code_challenge,
        lifetime_seconds,
    )


async def consume_code(pool: asyncpg.Pool, code_hash: str, client_id: str) -> CodeRow | None:
    """The code's consent, marking it used; None if unknown, expired or already used. A code
    used before ends the grant it was exchanged for (its tokens die with it)."""
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(_CONSUME_CODE, code_hash, client_id)
        if row is not None:
            return CodeRow(**dict(row))
        grant_id = await conn.fetchval(_FORGET_USED_CODE, code_hash, client_id)
        if grant_id is not None:
            await conn.execute(_DELETE_GRANT, grant_id)
        return None


# -- grants and refresh tokens ----------------------------------------------------------------

# Only while the consenting user is still a member of the workspace.
_INSERT_GRANT = """
INSERT INTO oauth_grants (id, workspace_id, user_id, client_id, client_name, resource,
                          server_id, toolset_id, scope)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9
WHERE EXISTS (SELECT 1 FROM memberships WHERE workspace_id = $2 AND user_id = $3)
"""

# The code was consumed by this exchange, and not presented again meanwhile (which deleted it).
_BIND_CODE = """
UPDATE oauth_codes SET grant_id = $1 WHERE code_hash = $2 AND grant_id IS NULL
"""

_INSERT_REFRESH = """
INSERT INTO oauth_refresh_tokens (token_hash, grant_id, expires_at)
SELECT $1, id, now() + make_interval(days => $3) FROM oauth_grants WHERE id = $2
"""


@dataclass(frozen=True, slots=True)
class GrantRow:
    id: uuid.UUID
    workspace_id: uuid.UUID
    user_id: uuid.UUID
    client_id: str
    client_name: str
    resource: str
    server_id: uuid.UUID | None
    toolset_id: uuid.UUID | None
    scope: str
    created_at: datetime
    last_used_at: datetime | None


_GRANT_COLUMNS = (
    "g.id, g.workspace_id, g.user_id, g.client_id, g.client_name, g.resource, g.server_id, "
    "g.toolset_id, g.scope, g.created_at, g.last_used_at"
)


async def open_grant(
    pool: asyncpg.Pool,
    grant_id: uuid.UUID,
    code_hash: str,
    code: CodeRow,
    client_name: str,
    refresh_hash: str,
    refresh_days: int,
) -> bool:
    """The grant an exchanged code makes, with its first refresh token; False (nothing
    made) if the member left meanwhile or the code was presented again meanwhile."""
    try:
        async with pool.acquire() as conn, conn.transaction():
            made = await conn.execute(
                _INSERT_GRANT,
                grant_id,
                code.workspace_id,
                code.user_id,
                code.client_id,
                client_name,
                code.resource,
                code.server_id,
                code.toolset_id,
                code.scope,
            )
            if made != "INSERT 0 1" or await conn.execute(_BIND_CODE, grant_id, code_hash) != (
                "UPDATE 1"
            ):
                raise _Abandoned()  # rolls the grant back with the transaction
            await conn.execute(_INSERT_REFRESH, refresh_hash, grant_id, refresh_days)
    except _Abandoned:
        return False
    except asyncpg.ForeignKeyViolationError:
        return False  # the client, server or toolset was deleted meanwhile
    return True


class _Abandoned(Exception):
    """A transaction given up on: nothing of it is kept."""


# Atomic: of two requests presenting one refresh token, only one rotates it. Only for the
# client it was issued to, while the member still belongs to the workspace.
_ROTATE_REFRESH = f"""
UPDATE oauth_refresh_tokens t SET rotated_at = now()
FROM oauth_grants g
WHERE t.token_hash = $1 AND t.grant_id = g.id AND g.client_id = $2
  AND t.rotated_at IS NULL AND t.expires_at > now()
  AND ($3::text IS NULL OR g.resource = $3)
  AND EXISTS (SELECT 1 FROM memberships m
              WHERE m.workspace_id = g.workspace_id AND m.user_id = g.user_id)
RETURNING {_GRANT_COLUMNS}
"""

# A refresh token presented after it was rotated: someone holds a copy. The grant ends.
_END_REUSED = """
DELETE FROM oauth_grants g USING oauth_refresh_tokens t
WHERE t.token_hash = $1 AND t.grant_id = g.id AND g.client_id = $2
  AND t.rotated_at IS NOT NULL
"""


async def rotate_refresh(
    pool: asyncpg.Pool, token_hash: str, client_id: str, resource: str | None
) -> GrantRow | None:
    """The grant of a refresh token, the token marked rotated; None if unknown, expired, of
    another client or resource, or of a member who left. One rotated before ends its grant."""
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(_ROTATE_REFRESH, token_hash, client_id, resource)
        if row is not None:
            return GrantRow(**dict(row))
        await conn.execute(_END_REUSED, token_hash, client_id)
        return None


async def add_refresh(
    db: Executor, grant_id: uuid.UUID, token_hash: str, refresh_days: int
) -> bool:
    """A new refresh token of the grant; False if the grant ended meanwhile."""
    try:
        status = await db.execute(_INSERT_REFRESH, token_hash, grant_id, refresh_days)
    except asyncpg.ForeignKeyViolationError:
        return False  # the grant was deleted after this statement's snapshot was taken
    return bool(status == "INSERT 0 1")


_REVOKE_BY_REFRESH = """
DELETE FROM oauth_grants g USING oauth_refresh_tokens t
WHERE t.token_hash = $1 AND t.grant_id = g.id AND g.client_id = $2
"""


async def revoke_by_refresh(db: Executor, token_hash: str, client_id: str) -> bool:
    """End the grant of a refresh token of this client (rotated or not)."""
    return await db.execute(_REVOKE_BY_REFRESH, token_hash, client_id) != "DELETE 0"


_DELETE_CLIENTS_GRANT = "DELETE FROM oauth_grants WHERE id = $1 AND client_id = $2"


async def revoke_grant(db: Executor, grant_id: uuid.UUID, client_id: str) -> bool:
    """End a grant of this client (its tokens die at once in every process: NOTIFY); False if
    the client has no such grant. (The dashboard's revocations: gateway/db/oauth_grants.)"""
    return await db.execute(_DELETE_CLIENTS_GRANT, grant_id, client_id) != "DELETE 0"


# -- what a consent is about ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """A server or toolset a member consents to, with its workspace."""

    workspace_id: uuid.UUID
    workspace_name: str
    name: str


_SERVER_TARGET = """
SELECT s.workspace_id, w.name AS workspace_name, s.name
FROM servers s JOIN workspaces w ON w.id = s.workspace_id WHERE s.id = $1
"""
_TOOLSET_TARGET = """
SELECT t.workspace_id, w.name AS workspace_name, t.name
FROM toolsets t JOIN workspaces w ON w.id = t.workspace_id WHERE t.id = $1
"""


async def target(db: Executor, kind: str, target_id: uuid.UUID) -> Target | None:
    """The server (kind "proxy") or toolset (kind "toolsets") of an MCP URL."""
    row = await db.fetchrow(_SERVER_TARGET if kind == "proxy" else _TOOLSET_TARGET, target_id)
    return None if row is None else Target(**dict(row))


# -- retention --------------------------------------------------------------------------------

# Used and expired codes are kept a day: a code presented again within it still ends its grant.
_PRUNE_CODES = """
DELETE FROM oauth_codes WHERE code_hash IN (
    SELECT code_hash FROM oauth_codes WHERE expires_at < now() - interval '1 day' LIMIT $1
)
"""
# Rotated refresh tokens are kept until they would have expired: a copy presented until then
# still ends its grant.
_PRUNE_REFRESH = """
DELETE FROM oauth_refresh_tokens WHERE token_hash IN (
    SELECT token_hash FROM oauth_refresh_tokens WHERE expires_at < now() LIMIT $1
)
"""
# Registered clients nobody consented to within 30 days, and cached metadata documents no
# grant uses (fetched again when next needed).
_PRUNE_CLIENTS = """
DELETE FROM oauth_clients WHERE client_id IN (
    SELECT c.client_id FROM oauth_clients c
    WHERE (CASE WHEN c.registered THEN c.created_at < now() - interval '30 days'
                ELSE c.fetched_at < now() - interval '1 day' END)
      AND NOT EXISTS (SELECT 1 FROM oauth_grants g WHERE g.client_id = c.client_id)
      AND NOT EXISTS (SELECT 1 FROM oauth_codes k WHERE k.client_id = c.client_id)
    LIMIT $1
)
"""


def _count(status: str) -> int:
    return int(status.rsplit(" ", 1)[1])


async def prune_codes(db: Executor, batch_size: int) -> int:
    return _count(await db.execute(_PRUNE_CODES, batch_size))


async def prune_refresh_tokens(db: Executor, batch_size: int) -> int:
    return _count(await db.execute(_PRUNE_REFRESH, batch_size))


async def prune_clients(db: Executor, batch_size: int) -> int:
    return _count(await db.execute(_PRUNE_CLIENTS, batch_size))
