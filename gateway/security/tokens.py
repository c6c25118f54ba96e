"""Access tokens (JWT, HS256, scoped to one workspace), OAuth access tokens (JWT, bound to one
MCP URL), opaque refresh tokens, invitation tokens and email verification tokens."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

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


def _issue(secret: str, kind: str, ttl_seconds: int, claims: dict[str, str]) -> str:
    """A signed JWT of one `type` (its purpose): a token of one kind never passes as another."""
    now = int(time.time())
    payload = {
        **claims,
        "type": kind,
        "iat": now,
        "exp": now + ttl_seconds,
        "jti": secrets.token_hex(8),
    }
    return jwt.encode(payload, secret, algorithm="HS256")


def _read(
    secret: str, token: str, kind: str, required: list[str], expired: str, invalid: str
) -> dict[str, Any]:
    """The claims of a JWT of this `type`, HS256 only, else InvalidToken(`expired` or
    `invalid`)."""
    try:
        payload: dict[str, Any] = jwt.decode(
            token, secret, algorithms=["HS256"], options={"require": ["exp", *required]}
        )
    except jwt.ExpiredSignatureError:
        raise InvalidToken(expired) from None
    except jwt.PyJWTError:
        raise InvalidToken(invalid) from None
    if payload.get("type") != kind or not all(isinstance(payload[c], str) for c in required):
        raise InvalidToken(invalid)
    return payload


def issue_access_token(secret: str, ttl_seconds: int, claims: AccessClaims) -> str:
    subject = {"sub": str(claims.user_id), "wid": str(claims.workspace_id)}
    return _issue(secret, "access", ttl_seconds, subject)


def read_access_token(secret: str, token: str) -> AccessClaims:
    invalid = "invalid access token"
    payload = _read(secret, token, "access", ["sub", "wid"], "access token expired", invalid)
    try:
        return AccessClaims(uuid.UUID(payload["sub"]), uuid.UUID(payload["wid"]))
    except ValueError:
        raise InvalidToken(invalid) from None


@dataclass(frozen=True, slots=True)
class OAuthClaims:
    """An OAuth access token's: the grant it was issued under (gateway/oauth), who consented,
    where, and the one MCP URL it is good for (its audience, RFC 8707)."""

    grant_id: uuid.UUID
    user_id: uuid.UUID
    workspace_id: uuid.UUID
    resource: str


_OAUTH_ACCESS = "oauth_access"


def issue_oauth_token(secret: str, ttl_seconds: int, claims: OAuthClaims, issuer: str) -> str:
    subject = {
        "gid": str(claims.grant_id),
        "sub": str(claims.user_id),
        "wid": str(claims.workspace_id),
        "aud": claims.resource,
        "iss": issuer,
    }
    return _issue(secret, _OAUTH_ACCESS, ttl_seconds, subject)


def read_oauth_token(secret: str, token: str, resource: str) -> OAuthClaims:
    """The claims of an OAuth access token good for `resource`; a token of another kind, or
    for another MCP URL, is InvalidToken."""
    invalid = "invalid OAuth access token"
    try:
        payload: dict[str, Any] = jwt.decode(
            token,
            secret,
            algorithms=["HS256"],
            audience=resource,
            options={"require": ["exp", "aud", "gid", "sub", "wid"]},
        )
    except jwt.ExpiredSignatureError:
        raise InvalidToken("OAuth access token expired") from None
    except jwt.InvalidAudienceError:
        raise InvalidToken("this OAuth access token is for another resource") from None
    except jwt.PyJWTError:
        raise InvalidToken(invalid) from None
    if payload.get("type") != _OAUTH_ACCESS:
        raise InvalidToken(invalid)
    try:
        return OAuthClaims(
            uuid.UUID(payload["gid"]),
            uuid.UUID(payload["sub"]),
            uuid.UUID(payload["wid"]),
            payload["aud"],
        )
    except (TypeError, ValueError):
        raise InvalidToken(invalid) from None


def is_oauth_token(token: str) -> bool:
    """Whether a bearer JWT is an OAuth access token (unverified: which reader to use)."""
    try:
        return jwt.decode(token, options={"verify_signature": False}).get("type") == _OAUTH_ACCESS
    except jwt.PyJWTError:
        return False


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
    """The token of an email verification link: signed, expiring, and bound to its purpose,
    to the user and to the address it was sent to."""
    subject = {"sub": str(claims.user_id), "email": claims.email}
    return _issue(secret, _EMAIL_VERIFICATION, ttl_seconds, subject)


def read_email_token(secret: str, token: str) -> EmailClaims:
    invalid = "this verification link is not valid"
    expired = "this verification link has expired: ask for a new one"
    payload = _read(secret, token, _EMAIL_VERIFICATION, ["sub", "email"], expired, invalid)
    try:
        return EmailClaims(uuid.UUID(payload["sub"]), payload["email"])
    except ValueError:
        raise InvalidToken(invalid) from None
