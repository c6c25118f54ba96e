"""/auth: signup, login, token refresh, logout, the current user, switching workspace,
invitations, verifying an address, changing a password."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from aiohttp import web
from pydantic import Field

from gateway.accounts import signup as accounts
from gateway.accounts.access import PRINCIPAL, SIGN_IN, USER, Principal
from gateway.api.models import Body, Email, Name, Out, Password, RoleName, UserOut
from gateway.api.routing import Routes
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


class LogoutIn(Body):
    refresh_token: str


class PasswordChangeIn(Body):
    current_password: str
    new_password: Password


class VerifyEmailIn(Body):
    token: str = Field(description="the last part of the emailed link, /verify-email/{token}")


class VerificationSent(Out):
    email: str
    expires_at: datetime = Field(description="when the emailed link stops working")


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
        description="accepts it (POST /auth/accept-invite/{token}). Shown only once your "
        "address is verified (`email_verified`): signing up with an address proves nothing, "
        "so until then the invitation is accepted with the link emailed to the address (or "
        "handed over by whoever invited you). Null as well for an invitation whose token "
        "cannot be derived again (made under another GATEWAY_JWT_SECRET)"
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
    email_verified: bool = Field(
        description="whether the address was verified through a link the gateway emailed to "
        "it (POST /auth/verify-email/send); never true on a gateway without SMTP_URL"
    )
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
    `invite_token`).

    When the gateway sends email (SMTP_URL), a link that verifies the address is emailed to
    it (see POST /auth/verify-email). An invitation token does not verify the address: the
    person who invited saw it too."""
    password_hash = await accounts.admit(request, body.email, body.password, body.invite_token)
    async with request.app[POOL].acquire() as conn, conn.transaction():
        user, workspace = await accounts.sign_up(
            conn, body.email, body.name, password_hash, body.invite_token
        )
        tokens = await _issue_tokens(request, conn, user, workspace)
    await accounts.welcome(request, user)
    return tokens


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


@routes.post(
    "/auth/logout",
    summary="Log out: end the session of a refresh token",
    access=SIGN_IN,
    status=204,
)
async def logout(request: web.Request, body: LogoutIn) -> None:
    """Ends the session (the refresh token family) the refresh token belongs to: neither it
    nor any token refreshed from it works again. An unknown, used or expired token is
    answered the same (204), as there is nothing left to end.

    Access tokens are stateless JWTs and are not looked up on each request: one already issued
    keeps working until it expires, within 15 minutes (`expires_in`). Discard it. A member's
    role is still read at each request, so removing someone from a workspace takes effect at
    once."""
    await refresh_db.revoke_family(request.app[POOL], hash_token(body.refresh_token))


@routes.post(
    "/auth/change-password",
    summary="Change your password (ends every session)",
    access=USER,
    response=TokenResponse,
    errors=(429,),
)
async def change_password(request: web.Request, body: PasswordChangeIn) -> dict[str, Any]:
    """Needs the current password: a wrong one is 403 (not 401: the caller's token is fine),
    and attempts are rate limited as logins are (429 with Retry-After). The password changes
    and every session of the account ends: every refresh token (API) and every dashboard
    sign-in, of every device. The answer is a new session (tokens scoped to the current
    workspace, or the home workspace if the caller left it), so the caller stays signed in.
    Access tokens issued before keep working until they expire (within 15 minutes)."""
    principal = request[PRINCIPAL]
    user = await _current_user(request.app[POOL], principal)
    stored, new_hash = await accounts.check_password_change(
        request, user, body.current_password, body.new_password
    )
    async with request.app[POOL].acquire() as conn, conn.transaction():
        await accounts.change_password(conn, user, stored, new_hash)
        workspace = await workspaces_db.get(conn, principal.workspace_id, user.id)
        workspace = workspace or await accounts.home_workspace(conn, user)
        return await _issue_tokens(request, conn, user, workspace)


async def _current_user(db: Executor, principal: Principal) -> User:
    assert principal.user_id is not None  # USER endpoints refuse API keys
    user = await users_db.by_id(db, principal.user_id)
    if user is None:
        raise Unauthorized("this account no longer exists")
    return user


@routes.get(
    "/auth/me",
    summary="The current user, workspace, workspaces and invitations",
    access=USER,
    response=MeOut,
)
async def me(request: web.Request) -> dict[str, Any]:
    """`pending_invites` lists the invitations sent to your address; their tokens only once
    the address is verified (`email_verified`)."""
    principal = request[PRINCIPAL]
    return await _me(request, await _current_user(request.app[POOL], principal), principal)


async def _me(request: web.Request, user: User, principal: Principal) -> dict[str, Any]:
    pool = request.app[POOL]
    verified = await users_db.email_verified_at(pool, user.id) is not None
    workspaces = await workspaces_db.list_for_user(pool, user.id)
    current = next((w for w in workspaces if w["id"] == principal.workspace_id), None)
    return {
        "id": user.id,
        "email": user.email,
        "name": user.name,
        "email_verified": verified,
        "current_workspace": current and {k: current[k] for k in ("id", "name", "slug", "role")},
        "workspaces": [
            {k: w[k] for k in ("id", "name", "slug", "role", "is_personal")} for w in workspaces
        ],
        "pending_invites": [
            with_token(request, invite, verified)
            for invite in await invites_db.pending_for_email(pool, user.email)
        ],
    }


def with_token(request: web.Request, invite: dict[str, Any], verified: bool) -> dict[str, Any]:
    """A pending invitation as its invitee sees it: its token, derived again (only its hash is
    stored), for a verified address only; null otherwise, and for an invitation made under
    another GATEWAY_JWT_SECRET."""
    stored = invite.pop("token_hash")
    if not verified:
        return {**invite, "token": None}
    token = invite_token(request.app[SETTINGS].jwt_secret, invite["id"])
    return {**invite, "token": token if hash_token(token) == stored else None}


@routes.post(
    "/auth/verify-email/send",
    summary="Email yourself a link that verifies your address",
    access=USER,
    response=VerificationSent,
    errors=(400, 429),
)
async def send_verification(request: web.Request) -> dict[str, Any]:
    """Sends `{PUBLIC_URL}/verify-email/{token}` to the account's address; the link is never
    shown anywhere else. It expires in 24 hours, and works only for this account signed in
    (POST /auth/verify-email, or the dashboard page the link opens). At most 3 links per
    address and hour, signup's included (429 with Retry-After).

    400 on a gateway without SMTP_URL, where addresses cannot be verified at all (invitations
    are then accepted with the link that whoever invited hands over), and for an address
    already verified."""
    user = await _current_user(request.app[POOL], request[PRINCIPAL])
    expires_at = await accounts.send_verification(request, user)
    return {"email": user.email, "expires_at": expires_at}


@routes.post(
    "/auth/verify-email",
    summary="Verify your address with the emailed link's token",
    access=USER,
    response=MeOut,
    errors=(400,),
)
async def verify_email(request: web.Request, body: VerifyEmailIn) -> dict[str, Any]:
    """The token of the link POST /auth/verify-email/send emailed, redeemed by the account it
    was made for (403 for another account: a stranger who signed up with your address cannot
    have it verified by your click). An invalid or expired token is 400. Answers as GET
    /auth/me does, now with the tokens of the invitations to the address. Verifying again is
    harmless."""
    principal = request[PRINCIPAL]
    user = await _current_user(request.app[POOL], principal)
    await accounts.verify_email(request, user, body.token)
    return await _me(request, user, principal)


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
    returns tokens scoped to the workspace joined. An expired, revoked or used token is 404.

    The token is the proof of controlling the address: it comes from the emailed link (or
    from whoever invited), or from GET /auth/me once the address is verified."""
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
