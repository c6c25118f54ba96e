"""Accounts: signing up, checking a login, joining by invitation, where a login lands.

The API (which answers with tokens) and the dashboard (which opens a cookie session) both
sign people in through these.
"""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web

from gateway.db import invites as invites_db
from gateway.db import memberships as memberships_db
from gateway.db import users as users_db
from gateway.db import workspaces as workspaces_db
from gateway.db.types import Connection
from gateway.db.users import User
from gateway.errors import BadRequest, Forbidden, NotFound, Unauthorized
from gateway.keys import AUTHENTICATOR, POOL, RATE_LIMITER, SETTINGS
from gateway.ratelimit import client_address
from gateway.security.passwords import hash_password, verify_password

_INVITE_GONE = "invitation not found, expired or already used"


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
