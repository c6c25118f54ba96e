"""SQL for users."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from gateway.db.types import Executor


@dataclass(frozen=True, slots=True)
class User:
    id: uuid.UUID
    email: str
    name: str


_INSERT = "INSERT INTO users (email, name, password_hash) VALUES ($1, $2, $3) RETURNING id"
_BY_EMAIL = "SELECT id, email, name, password_hash FROM users WHERE email = $1"
_BY_ID = "SELECT id, email, name FROM users WHERE id = $1"


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
