"""SQL for dashboard sessions: opened at sign-in, found per page, ended at logout."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from gateway.db.types import Executor


@dataclass(frozen=True, slots=True)
class DashboardSession:
    id_hash: str
    user_id: uuid.UUID
    email: str
    name: str
    # None when the workspace it showed was deleted.
    workspace_id: uuid.UUID | None


# Expired sessions of anyone are cleared as new ones open: the table stays the size of the
# sessions in use without a loop of its own.
_OPEN = """
WITH expired AS (
    DELETE FROM dashboard_sessions
    WHERE id_hash IN (SELECT id_hash FROM dashboard_sessions WHERE expires_at < now() LIMIT 100)
)
INSERT INTO dashboard_sessions (id_hash, user_id, workspace_id, expires_at)
VALUES ($1, $2, $3, now() + $4::interval)
"""

# A session in use is extended (sliding expiry), at most once a minute to spare writes, and
# never past its absolute limit.
_FIND = """
WITH found AS (
    SELECT s.id_hash, s.user_id, s.workspace_id, s.last_seen_at, s.created_at,
           u.email, u.name
    FROM dashboard_sessions AS s JOIN users AS u ON u.id = s.user_id
    WHERE s.id_hash = $1 AND s.expires_at > now()
), touched AS (
    UPDATE dashboard_sessions AS s
    SET last_seen_at = now(), expires_at = least(now() + $2::interval, s.created_at + $3::interval)
    FROM found
    WHERE s.id_hash = found.id_hash AND found.last_seen_at < now() - interval '1 minute'
)
SELECT id_hash, user_id, email, name, workspace_id FROM found
"""

_SWITCH = "UPDATE dashboard_sessions SET workspace_id = $2 WHERE id_hash = $1"
_END = "DELETE FROM dashboard_sessions WHERE id_hash = $1"
_END_ALL_FOR_USER = "DELETE FROM dashboard_sessions WHERE user_id = $1"


async def open_session(
    db: Executor, id_hash: str, user_id: uuid.UUID, workspace_id: uuid.UUID, idle: timedelta
) -> None:
    await db.execute(_OPEN, id_hash, user_id, workspace_id, idle)


async def find(
    db: Executor, id_hash: str, idle: timedelta, lifetime: timedelta
) -> DashboardSession | None:
    row = await db.fetchrow(_FIND, id_hash, idle, lifetime)
    return None if row is None else DashboardSession(**dict(row))


async def switch(db: Executor, id_hash: str, workspace_id: uuid.UUID) -> None:
    await db.execute(_SWITCH, id_hash, workspace_id)


async def end(db: Executor, id_hash: str) -> None:
    await db.execute(_END, id_hash)


async def end_all_for_user(db: Executor, user_id: uuid.UUID) -> None:
    """Every dashboard sign-in of the user ends (a password change)."""
    await db.execute(_END_ALL_FOR_USER, user_id)
