"""Access tokens (JWT, HS256, scoped to one workspace) and opaque refresh tokens."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
import uuid
from dataclasses import dataclass

import jwt


@dataclass(frozen=True, slots=True)
class AccessClaims:
    user_id: uuid.UUID
    workspace_id: uuid.UUID


class InvalidToken(Exception):
    """Malformed, forged or expired; the message says which, for the 401 detail."""


def issue_access_token(secret: str, ttl_seconds: int, claims: AccessClaims) -> str:
    now = int(time.time())
    payload = {
        "sub": str(claims.user_id),
        "wid": str(claims.workspace_id),
        "type": "access",
        "iat": now,
        "exp": now + ttl_seconds,
        "jti": secrets.token_hex(8),
    }
    return jwt.encode(payload, secret, algorithm="HS256")


def read_access_token(secret: str, token: str) -> AccessClaims:
    try:
        payload = jwt.decode(
            token, secret, algorithms=["HS256"], options={"require": ["exp", "sub", "wid"]}
        )
    except jwt.ExpiredSignatureError:
        raise InvalidToken("access token expired") from None
    except jwt.PyJWTError:
        raise InvalidToken("invalid access token") from None
    if payload.get("type") != "access":
        raise InvalidToken("invalid access token")
    try:
        return AccessClaims(uuid.UUID(payload["sub"]), uuid.UUID(payload["wid"]))
    except (ValueError, TypeError, AttributeError):
        raise InvalidToken("invalid access token") from None


def new_opaque_token() -> str:
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """Tokens and API keys are high-entropy, so a plain SHA-256 is a safe lookup hash."""
    return hashlib.sha256(token.encode()).hexdigest()


def invite_token(secret: str, invite_id: uuid.UUID) -> str:
    """An invitation's token: derived from its id with the server's secret, so it need not be
    stored (only its hash is) and can still be shown again to the invitee (GET /auth/me)."""
    mac = hmac.new(secret.encode(), b"invitation:" + invite_id.bytes, hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()
