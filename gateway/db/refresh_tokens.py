"""SQL for refresh tokens: issue, rotate, revoke a family on reuse or logout, and every family
of a user when their password changes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from gateway.db.types import Executor

_INSERT = """
INSERT INTO refresh_tokens (family_id, user_id, workspace_id, token_hash, expires_at)
VALUES ($1, $2, $3, $4, now() + make_interval(days => $5))
"""

# Atomic: of two concurrent uses of one token only one can mark it used.
_USE = """
UPDATE refresh_tokens SET used_at = now()
WHERE token_hash = $1 AND used_at IS NULL AND revoked_at IS NULL AND expires_at > now()
RETURNING family_id, user_id, workspace_id
"""

_REVOKE_FAMILY_OF = """
UPDATE refresh_tokens SET revoked_at = now()
WHERE revoked_at IS NULL AND family_id = (
    SELECT family_id FROM refresh_tokens WHERE token_hash = $1 AND used_at IS NOT NULL
)
"""

# Logout: the family of the token presented, whatever state that token is in (only its
# holder can present it).
_REVOKE_FAMILY = """
UPDATE refresh_tokens SET revoked_at = now()
WHERE revoked_at IS NULL AND family_id = (
    SELECT family_id FROM refresh_tokens WHERE token_hash = $1
)
"""

_REVOKE_USER = """
UPDATE refresh_tokens SET revoked_at = now()
WHERE user_id = $1 AND revoked_at IS NULL AND used_at IS NULL
"""


@dataclass(frozen=True, slots=True)
class Session:
    family_id: uuid.UUID
    user_id: uuid.UUID
    workspace_id: uuid.UUID


async def insert(db: Executor, session: Session, token_hash: str, ttl_days: int) -> None:
    await db.execute(
        _INSERT, session.family_id, session.user_id, session.workspace_id, token_hash, ttl_days
    )


async def use(db: Executor, token_hash: str) -> Session | None:
    """Mark the token used and return its session; None if unknown, expired or used."""
    row = await db.fetchrow(_USE, token_hash)
    return None if row is None else Session(row["family_id"], row["user_id"], row["workspace_id"])


async def revoke_family_if_reused(db: Executor, token_hash: str) -> None:
    """An already-used token presented again is a sign of theft: end its whole session."""
    await db.execute(_REVOKE_FAMILY_OF, token_hash)


async def revoke_family(db: Executor, token_hash: str) -> None:
    """Logout: the token's session ends (an unknown token changes nothing)."""
    await db.execute(_REVOKE_FAMILY, token_hash)


async def revoke_all_for_user(db: Executor, user_id: uuid.UUID) -> None:
    """Every session of the user ends (a password change)."""
    await db.execute(_REVOKE_USER, user_id)
