"""SQL for users: accounts, their password hashes and whether their address is verified."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from gateway.db.types import Connection, Executor


@dataclass(frozen=True, slots=True)
class User:
    id: uuid.UUID
    email: str
    name: str


_INSERT = "INSERT INTO users (email, name, password_hash) VALUES ($1, $2, $3) RETURNING id"
_BY_EMAIL = "SELECT id, email, name, password_hash FROM users WHERE email = $1"
_BY_ID = "SELECT id, email, name FROM users WHERE id = $1"
_PASSWORD_HASH = "SELECT password_hash FROM users WHERE id = $1"

# Compare and set: of two changes racing from the same old password only one applies.
_SET_PASSWORD_HASH = """
UPDATE users SET password_hash = $3 WHERE id = $1 AND password_hash = $2 RETURNING id
"""

_VERIFIED_AT = "SELECT email_verified_at FROM users WHERE id = $1"

# Only for the address the link was sent to: a link for an earlier address verifies nothing.
_MARK_VERIFIED = """
UPDATE users SET email_verified_at = coalesce(email_verified_at, now())
WHERE id = $1 AND email = $2 RETURNING email_verified_at
"""

# Held by the transaction that adds a workspace for the user, so that two creations at once
# count each other (NO KEY: the memberships' foreign keys, FOR KEY SHARE, are not held up).
_LOCK = "SELECT 1 FROM users WHERE id = $1 FOR NO KEY UPDATE"


async def insert(db: Executor, email: str, name: str, password_hash: str) -> User:
    user_id: uuid.UUID = await db.fetchval(_INSERT, email, name, password_hash)
    return User(user_id, email, name)


async def by_email(db: Executor, email: str) -> tuple[User, str] | None:
    """The user and their password hash."""
    row = await db.fetchrow(_BY_EMAIL, email)
    if row is None:
        return None
    return User(row["id"], row["email"], row["name"]), row["password_hash"]


async def by_id(db: Executor, user_id: uuid.UUID) -> User | None:
    row = await db.fetchrow(_BY_ID, user_id)
    return None if row is None else User(row["id"], row["email"], row["name"])


async def password_hash(db: Executor, user_id: uuid.UUID) -> str | None:
    found: str | None = await db.fetchval(_PASSWORD_HASH, user_id)
    return found


async def set_password_hash(db: Executor, user_id: uuid.UUID, old: str, new: str) -> bool:
    """False when the stored hash is no longer `old` (changed meanwhile)."""
    return await db.fetchval(_SET_PASSWORD_HASH, user_id, old, new) is not None


async def email_verified_at(db: Executor, user_id: uuid.UUID) -> datetime | None:
    verified: datetime | None = await db.fetchval(_VERIFIED_AT, user_id)
    return verified


async def mark_verified(db: Executor, user_id: uuid.UUID, email: str) -> datetime | None:
    """When the address was verified (now, or earlier); None when the user no longer has
    this address (or no longer exists)."""
    verified: datetime | None = await db.fetchval(_MARK_VERIFIED, user_id, email)
    return verified


async def lock(conn: Connection, user_id: uuid.UUID) -> None:
    await conn.execute(_LOCK, user_id)
