"""Access tokens (JWT, HS256, scoped to one workspace), opaque refresh tokens, invitation
tokens and email verification tokens."""

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


# A verification link works this long; another can be asked for (rate limited).
EMAIL_VERIFICATION_TTL_SECONDS = 24 * 3600
_EMAIL_VERIFICATION = "email_verification"


@dataclass(frozen=True, slots=True)
class EmailClaims:
    user_id: uuid.UUID
    email: str


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


def issue_email_token(secret: str, claims: EmailClaims, ttl_seconds: int) -> str:
    """The token of an email verification link: signed, expiring, and bound to its purpose
    (its `type` is not "access", so it never passes as an access token, nor one as it), to
    the user and to the address it was sent to."""
    now = int(time.time())
    payload = {
        "sub": str(claims.user_id),
        "email": claims.email,
        "type": _EMAIL_VERIFICATION,
        "iat": now,
        "exp": now + ttl_seconds,
        "jti": secrets.token_hex(8),
    }
    return jwt.encode(payload, secret, algorithm="HS256")


def read_email_token(secret: str, token: str) -> EmailClaims:
    try:
        payload = jwt.decode(
            token, secret, algorithms=["HS256"], options={"require": ["exp", "sub", "email"]}
        )
    except jwt.ExpiredSignatureError:
        raise InvalidToken("this verification link has expired: ask for a new one") from None
    except jwt.PyJWTError:
        raise InvalidToken("this verification link is not valid") from None
    email = payload.get("email")
    if payload.get("type") != _EMAIL_VERIFICATION or not isinstance(email, str):
        raise InvalidToken("this verification link is not valid")
    try:
        return EmailClaims(uuid.UUID(payload["sub"]), email)
    except (ValueError, TypeError, AttributeError):
        raise InvalidToken("this verification link is not valid") from None
