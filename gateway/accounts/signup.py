"""Accounts: signing up, checking a login, joining by invitation, where a login lands,
verifying an address, changing a password.

The API (which answers with tokens) and the dashboard (which opens a cookie session) both
sign people in through these.

Who controls an address: nobody, as far as the gateway knows, until they open a link it sent
there. A signup proves nothing (anyone can type any address), so an invitation is accepted
only with its own token (from the emailed link, or handed over by whoever invited), and an
account is shown the tokens of invitations to its address only once the address is verified
through a link the gateway emailed to it. Opening that link needs the account's own sign-in:
a stranger who signed up with your address cannot get it verified by your click.
"""

from __future__ import annotations

import logging
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from gateway.accounts.access import AUTHENTICATOR
from gateway.accounts.mailer import MAILER
from gateway.accounts.ratelimit import EMAIL_RATE_LIMITER, RATE_LIMITER, client_address
from gateway.db import dashboard_sessions as sessions_db
from gateway.db import invites as invites_db
from gateway.db import memberships as memberships_db
from gateway.db import refresh_tokens as refresh_db
from gateway.db import users as users_db
from gateway.db import workspaces as workspaces_db
from gateway.db.types import Connection
from gateway.db.users import User
from gateway.errors import ApiError, BadRequest, Forbidden, NotFound, Unauthorized
from gateway.keys import POOL, SETTINGS
from gateway.security.passwords import hash_password, verify_password
from gateway.security.tokens import (
    EMAIL_VERIFICATION_TTL_SECONDS,
    EmailClaims,
    InvalidToken,
    issue_email_token,
    read_email_token,
)

log = logging.getLogger(__name__)

_INVITE_GONE = "invitation not found, expired or already used"

# Verification emails to one address (signup's included): each goes to an address anyone may
# have typed, so few, and with nothing in them of the sender's choosing.
VERIFICATION_EMAIL_RATE = "3/hour"
NO_EMAIL = (
    "this gateway sends no email (SMTP_URL is not set), so addresses cannot be verified here: "
    "invitations are accepted with the link the person who invited you sends you"
)
ALREADY_VERIFIED = "your email address is already verified"


async def _rate_limit(request: web.Request, email: str) -> None:
    address = client_address(request, request.app[SETTINGS].trusted_proxies)
    await request.app[RATE_LIMITER].hit(f"ip:{address}", f"email:{email}")


async def admit(request: web.Request, email: str, password: str, invite_token: str | None) -> str:
    """Before a signup's transaction (no connection held while hashing): the rate limit, the
    invitation's check, and the password's hash, which is returned."""
    refusal = signup_refusal(request, invite_token)
    if refusal is not None:
        raise Forbidden(refusal)
    await _rate_limit(request, email)
    if invite_token is not None:
        invite = await invites_db.pending_by_token(request.app[POOL], invite_token)
        if invite is None:
            raise NotFound(_INVITE_GONE)
        if invite["email"] != email:
            raise BadRequest("this invitation was sent to a different email address")
    return await hash_password(password)


def signup_refusal(request: web.Request, invite_token: str | None) -> str | None:
    """Why this gateway's signup policy (GATEWAY_SIGNUP) refuses a signup, or None."""
    policy = request.app[SETTINGS].signup
    if policy == "closed":
        return "signing up is closed on this gateway: ask its administrator for an account"
    if policy == "invite" and invite_token is None:
        return "signing up on this gateway needs an invitation: use the link it was sent with"
    return None


async def sign_up(
    conn: Connection, email: str, name: str, password_hash: str, invite_token: str | None
) -> tuple[User, dict[str, Any]]:
    """A new user with a personal workspace, in the caller's transaction (after admit()); with
    an invitation they join its workspace at once. Returns the user and the workspace they
    land in."""
    user = await users_db.insert(conn, email, name, password_hash)
    workspace = await _create_personal(conn, user)
    if invite_token is not None:
        workspace = await _join(conn, invite_token, user)
    return user, workspace


async def log_in(request: web.Request, email: str, password: str) -> User:
    """The user with this email and password, else 401 (the same for either mistake)."""
    await _rate_limit(request, email)
    found = await users_db.by_email(request.app[POOL], email)
    if not await verify_password(found[1] if found else None, password) or found is None:
        raise Unauthorized("invalid email or password")
    return found[0]


async def accept_invitation(
    request: web.Request, conn: Connection, user: User, token: str
) -> dict[str, Any]:
    """Join the invitation's workspace (sent to the user's email, else 403); returns it."""
    invite = await invites_db.pending_by_token(conn, token)
    if invite is None:
        raise NotFound(_INVITE_GONE)
    if invite["email"] != user.email:
        raise Forbidden("this invitation was sent to a different email address")
    return await _join(conn, token, user)


async def send_verification(request: web.Request, user: User) -> datetime:
    """Email the user a link that verifies their address; returns when it expires. Refused
    (400) without SMTP_URL and for a verified address; at most VERIFICATION_EMAIL_RATE per
    address (429)."""
    app = request.app
    settings = app[SETTINGS]
    if not app[MAILER].sends:
        raise BadRequest(NO_EMAIL)
    if await users_db.email_verified_at(app[POOL], user.id) is not None:
        raise BadRequest(ALREADY_VERIFIED)
    await app[EMAIL_RATE_LIMITER].hit(f"verify:{user.email}")
    ttl = EMAIL_VERIFICATION_TTL_SECONDS
    token = issue_email_token(settings.jwt_secret, EmailClaims(user.id, user.email), ttl)
    app[MAILER].send_verification(
        user.email, f"{settings.base_url}/verify-email/{token}", ttl // 3600
    )
    return datetime.now(UTC) + timedelta(seconds=ttl)


async def welcome(request: web.Request, user: User) -> None:
    """After a signup committed: the verification link, when this gateway sends email (a
    failure here never fails the signup; the user can ask again)."""
    if not request.app[MAILER].sends:
        return
    try:
        await send_verification(request, user)
    except ApiError as exc:
        log.warning("no verification email sent at signup of %s: %s", user.email, exc.detail)


async def verify_email(request: web.Request, user: User, token: str) -> datetime:
    """Mark the user's address verified with the token of a link the gateway emailed; only
    the signed-in account the link was made for can use it (403 for another). Returns when
    the address was verified."""
    try:
        claims = read_email_token(request.app[SETTINGS].jwt_secret, token)
    except InvalidToken as exc:
        raise BadRequest(str(exc)) from None
    if claims.user_id != user.id:
        raise Forbidden(
            "this verification link is for another account: sign in as the account it was sent for"
        )
    verified = await users_db.mark_verified(request.app[POOL], user.id, claims.email)
    if verified is None:
        raise BadRequest("this verification link was sent to another address: ask for a new one")
    return verified


async def check_password_change(
    request: web.Request, user: User, current: str, new: str
) -> tuple[str, str]:
    """Before the change's transaction (no connection held while hashing): the rate limit
    (that of login), the current password (403 when wrong), and the new one's hash. Returns
    the stored hash and the new one."""
    await _rate_limit(request, user.email)
    stored = await users_db.password_hash(request.app[POOL], user.id)
    if stored is None or not await verify_password(stored, current):
        # Not 401: the caller's own credentials are fine, and a client reading 401 would
        # throw away a perfectly good session.
        raise Forbidden("current_password is not the password of this account")
    return stored, await hash_password(new)


async def change_password(conn: Connection, user: User, stored: str, new_hash: str) -> None:
    """In the caller's transaction: the new password, and every session of the user ended,
    API refresh tokens and dashboard sign-ins alike (the caller opens the one that goes on)."""
    if not await users_db.set_password_hash(conn, user.id, stored, new_hash):
        raise Forbidden("the password was changed meanwhile: sign in again")
    await refresh_db.revoke_all_for_user(conn, user.id)
    await sessions_db.end_all_for_user(conn, user.id)


def forget_membership(request: web.Request, workspace: dict[str, Any], user: User) -> None:
    """After the transaction that added a membership: this process's role cache learns it."""
    request.app[AUTHENTICATOR].forget_membership(workspace["id"], user.id)


async def _create_personal(conn: Connection, user: User) -> dict[str, Any]:
    slug = f"{workspaces_db.slugify(user.name)[:40]}-{secrets.token_hex(3)}"
    return await workspaces_db.create(
        conn, user.id, f"{user.name}'s workspace", slug, personal=True
    )


async def _join(conn: Connection, token: str, user: User) -> dict[str, Any]:
    accepted = await invites_db.accept(conn, token)
    if accepted is None:
        raise NotFound(_INVITE_GONE)
    await memberships_db.add(conn, accepted["workspace_id"], user.id, accepted["role"])
    workspace = await workspaces_db.get(conn, accepted["workspace_id"], user.id)
    assert workspace is not None
    return workspace


async def home_workspace(conn: Connection, user: User) -> dict[str, Any]:
    """Where a login lands: the personal workspace, else the oldest membership, else (the
    user was removed from everything, even their personal workspace) a new personal one."""
    workspace = await workspaces_db.personal(conn, user.id)
    if workspace is None:
        workspaces = await workspaces_db.list_for_user(conn, user.id)
        workspace = workspaces[0] if workspaces else await _create_personal(conn, user)
    return workspace
