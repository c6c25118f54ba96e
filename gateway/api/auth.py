"""/auth: signup, login, token refresh, the current user, switching workspace, invitations."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from aiohttp import web
from pydantic import Field

from gateway import accounts
from gateway.api.models import Body, Email, Name, Out, Password, RoleName, UserOut
from gateway.api.routing import Routes
from gateway.auth import PRINCIPAL, SIGN_IN, USER
from gateway.db import invites as invites_db
from gateway.db import refresh_tokens as refresh_db
from gateway.db import users as users_db
from gateway.db import workspaces as workspaces_db
from gateway.db.types import Executor
from gateway.db.users import User
from gateway.errors import NotFound, Unauthorized
from gateway.keys import POOL, SETTINGS
from gateway.security.tokens import (
    AccessClaims,
    hash_token,
    invite_token,
    issue_access_token,
    new_opaque_token,
)

routes = Routes("auth")


class SignupIn(Body):
    email: Email
    password: Password
    name: Name
    invite_token: str | None = None


class LoginIn(Body):
    email: Email
    password: str


class RefreshIn(Body):
    refresh_token: str


class SwitchIn(Body):
    workspace_id: uuid.UUID


class TokenWorkspace(Out):
    id: uuid.UUID
    name: str
    slug: str
    role: RoleName


class TokenResponse(Out):
    access_token: str
    refresh_token: str
    token_type: Literal["bearer"]
    expires_in: int
    user: UserOut
    workspace: TokenWorkspace


class PendingInviteOut(Out):
    id: uuid.UUID
    token: str | None = Field(
        description="accepts it (POST /auth/accept-invite/{token}); null when it cannot be "
        "shown again (stored only as a hash since before this version): use the emailed link"
    )
    workspace_id: uuid.UUID
    workspace_name: str
    role: RoleName
    invited_by: uuid.UUID | None
    created_at: datetime
    expires_at: datetime


class MeWorkspace(Out):
    id: uuid.UUID
    name: str
    slug: str
    role: RoleName
    is_personal: bool


class MeOut(Out):
    id: uuid.UUID
    email: str
    name: str
    current_workspace: TokenWorkspace | None
    workspaces: list[MeWorkspace]
    pending_invites: list[PendingInviteOut]


async def _issue_tokens(
    request: web.Request,
    db: Executor,
    user: User,
    workspace: dict[str, Any],
    family_id: uuid.UUID | None = None,
) -> dict[str, Any]:
    """A new access token and refresh token; family_id continues a session on refresh."""
    settings = request.app[SETTINGS]
    refresh_token = new_opaque_token()
    session = refresh_db.Session(family_id or uuid.uuid4(), user.id, workspace["id"])
    await refresh_db.insert(db, session, hash_token(refresh_token), settings.refresh_token_ttl_days)
    access_token = issue_access_token(
        settings.jwt_secret,
        settings.access_token_ttl_seconds,
        AccessClaims(user_id=user.id, workspace_id=workspace["id"]),
    )
    return {
        "access_token": access_token,
        "refresh_token": refresh_token,
        "token_type": "bearer",
        "expires_in": settings.access_token_ttl_seconds,
        "user": {"id": user.id, "email": user.email, "name": user.name},
        "workspace": {k: workspace[k] for k in ("id", "name", "slug", "role")},
    }


@routes.post(
    "/auth/signup",
    summary="Create an account (and its personal workspace)",
    access=SIGN_IN,
    status=201,
    response=TokenResponse,
    errors=(404, 429),
)
async def signup(request: web.Request, body: SignupIn) -> dict[str, Any]:
    """With `invite_token`, the invitation (for this same email) is accepted at once and the
    tokens are scoped to the inviting workspace; otherwise to the new personal workspace.
    GATEWAY_SIGNUP may close signup (403), or open it to invited people only (403 without
    `invite_token`)."""
    password_hash = await accounts.admit(request, body.email, body.password, body.invite_token)
    async with request.app[POOL].acquire() as conn, conn.transaction():
        user, workspace = await accounts.sign_up(
            conn, body.email, body.name, password_hash, body.invite_token
        )
        return await _issue_tokens(request, conn, user, workspace)


@routes.post(
    "/auth/login",
    summary="Log in with email and password",
    access=SIGN_IN,
    response=TokenResponse,
    errors=(401, 429),
)
async def login(request: web.Request, body: LoginIn) -> dict[str, Any]:
    user = await accounts.log_in(request, body.email, body.password)
    async with request.app[POOL].acquire() as conn, conn.transaction():
        return await _issue_tokens(request, conn, user, await accounts.home_workspace(conn, user))


@routes.post(
    "/auth/refresh",
    summary="Exchange a refresh token for new tokens",
    access=SIGN_IN,
    response=TokenResponse,
    errors=(401,),
)
async def refresh(request: web.Request, body: RefreshIn) -> dict[str, Any]:
    """The refresh token rotates: the one sent stops working. Sending an already-used refresh
    token again revokes every token of that session (theft detection). The new tokens keep the
    session's workspace, or fall back to the personal workspace if the user left it."""
    pool = request.app[POOL]
    token_hash = hash_token(body.refresh_token)
    async with pool.acquire() as conn:
        async with conn.transaction():
            session = await refresh_db.use(conn, token_hash)
            user = None if session is None else await users_db.by_id(conn, session.user_id)
            if session is not None and user is not None:
                workspace = await workspaces_db.get(conn, session.workspace_id, user.id)
                workspace = workspace or await accounts.home_workspace(conn, user)
                return await _issue_tokens(request, conn, user, workspace, session.family_id)
        await refresh_db.revoke_family_if_reused(conn, token_hash)
    raise Unauthorized("invalid, expired or already used refresh token")


@routes.get(
    "/auth/me",
    summary="The current user, workspace, workspaces and invitations",
    access=USER,
    response=MeOut,
)
async def me(request: web.Request) -> dict[str, Any]:
    principal = request[PRINCIPAL]
    pool = request.app[POOL]
    assert principal.user_id is not None
    user = await users_db.by_id(pool, principal.user_id)
    if user is None:
        raise Unauthorized("this account no longer exists")
    workspaces = await workspaces_db.list_for_user(pool, user.id)
    current = next((w for w in workspaces if w["id"] == principal.workspace_id), None)
    return {
        "id": user.id,
        "email": user.email,
        "name": user.name,
        "current_workspace": current and {k: current[k] for k in ("id", "name", "slug", "role")},
        "workspaces": [
            {k: w[k] for k in ("id", "name", "slug", "role", "is_personal")} for w in workspaces
        ],
        "pending_invites": [
            _with_token(request, invite)
            for invite in await invites_db.pending_for_email(pool, user.email)
        ],
    }


def _with_token(request: web.Request, invite: dict[str, Any]) -> dict[str, Any]:
    """The invitee's own token, derived again (only its hash is stored); null for an
    invitation made before tokens were derived, or under another GATEWAY_JWT_SECRET."""
    stored = invite.pop("token_hash")
    token = invite_token(request.app[SETTINGS].jwt_secret, invite["id"])
    return {**invite, "token": token if hash_token(token) == stored else None}


@routes.post(
    "/auth/switch-workspace",
    summary="New tokens scoped to another workspace",
    access=USER,
    response=TokenResponse,
    errors=(404,),
)
async def switch_workspace(request: web.Request, body: SwitchIn) -> dict[str, Any]:
    principal = request[PRINCIPAL]
    assert principal.user_id is not None
    pool = request.app[POOL]
    async with pool.acquire() as conn, conn.transaction():
        user = await users_db.by_id(conn, principal.user_id)
        workspace = await workspaces_db.get(conn, body.workspace_id, principal.user_id)
        if user is None or workspace is None:
            raise NotFound("workspace not found")
        return await _issue_tokens(request, conn, user, workspace)


@routes.post(
    "/auth/accept-invite/{token}",
    summary="Accept an invitation sent to your email",
    access=USER,
    response=TokenResponse,
    errors=(404,),
)
async def accept_invite(request: web.Request, token: str) -> dict[str, Any]:
    """Needs the invitee logged in, with the email the invitation was sent to (else 403);
    returns tokens scoped to the workspace joined. An expired, revoked or used token is 404."""
    principal = request[PRINCIPAL]
    assert principal.user_id is not None
    async with request.app[POOL].acquire() as conn, conn.transaction():
        user = await users_db.by_id(conn, principal.user_id)
        if user is None:
            raise NotFound("invitation not found, expired or already used")
        workspace = await accounts.accept_invitation(request, conn, user, token)
        tokens = await _issue_tokens(request, conn, user, workspace)
    accounts.forget_membership(request, workspace, user)
    return tokens
