"""/workspaces: workspaces, their members, invitations and API keys."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import Field

from gateway.accounts.access import (
    AUTHENTICATOR,
    PRINCIPAL,
    USER,
    WS_ADMIN,
    WS_MEMBER,
    WS_OWNER,
    Principal,
    Role,
)
from gateway.accounts.mailer import MAILER
from gateway.api.models import (
    Body,
    Email,
    InviteRole,
    Name,
    Out,
    Permission,
    Permissions,
    RateLimitText,
    RoleName,
    Slug,
    ToolPatterns,
    WorkspaceOut,
)
from gateway.api.routing import Routes
from gateway.db import api_keys as api_keys_db
from gateway.db import invites as invites_db
from gateway.db import memberships as memberships_db
from gateway.db import users as users_db
from gateway.db import workspaces as workspaces_db
from gateway.db.bounds import AtBound
from gateway.errors import (
    BadRequest,
    BoundReached,
    Forbidden,
    NotFound,
    TooManyRequests,
    ValidationFailed,
)
from gateway.keys import POOL, SETTINGS
from gateway.policy.rules import MAX_PATTERNS, PERMISSIONS
from gateway.security.api_keys import DISPLAY_PREFIX_LENGTH, new_api_key
from gateway.security.tokens import hash_token, invite_token

routes = Routes("workspaces")


class WorkspaceIn(Body):
    name: Name
    slug: Slug | None = None


class WorkspacePatch(Body):
    name: Name | None = None
    slug: Slug | None = None


class MemberOut(Out):
    user_id: uuid.UUID
    email: str
    name: str
    role: RoleName
    joined_at: datetime


class MemberPatch(Body):
    role: RoleName


class InviteIn(Body):
    email: Email
    role: InviteRole = "member"


class InviteOut(Out):
    id: uuid.UUID
    email: str
    role: InviteRole
    status: Literal["pending", "accepted", "revoked"]
    invited_by: uuid.UUID | None
    created_at: datetime
    expires_at: datetime


class InviteCreated(InviteOut):
    invite_url: str


_PERMISSIONS = (
    "what the key may do: `proxy` (MCP through the proxy), `ingest` (POST /tool-calls), "
    "`read` (the workspace's data); a missing right is 403"
)
_ALLOWED_SERVERS = (
    "null: every server of the workspace; else the ids of the only servers it may use "
    "(a deleted server leaves the list)"
)
_ALLOWED_TOOLS = "null: every tool; else the only tools it may call, as name globs (* and ?)"
_KEY_RATE_LIMIT = "null: none; else at most this many of the key's tools/calls, e.g. '100/minute'"


class ApiKeyRules(Body):
    """The governed-access fields of a key, as a create or a PATCH gives them."""

    permissions: Permissions = Field(default=["proxy", "ingest", "read"], description=_PERMISSIONS)
    allowed_servers: Annotated[list[uuid.UUID], Field(max_length=MAX_PATTERNS)] | None = Field(
        default=None, description=_ALLOWED_SERVERS
    )
    allowed_tools: ToolPatterns | None = Field(default=None, description=_ALLOWED_TOOLS)
    rate_limit: RateLimitText | None = Field(default=None, description=_KEY_RATE_LIMIT)

    def rules(self) -> api_keys_db.KeyRules:
        return api_keys_db.KeyRules(
            [p for p in PERMISSIONS if p in self.permissions],  # one order, whatever was sent
            None if self.allowed_servers is None else list(dict.fromkeys(self.allowed_servers)),
            self.allowed_tools,
            self.rate_limit,
        )


class ApiKeyIn(ApiKeyRules):
    name: Name


class ApiKeyPatch(ApiKeyRules):
    """Only supplied fields change (null is a value: every server, every tool, no limit)."""

    name: Name | None = None


class ApiKeyOut(Out):
    id: uuid.UUID
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    created_by: uuid.UUID | None
    permissions: list[Permission] = Field(description=_PERMISSIONS)
    allowed_servers: list[uuid.UUID] | None = Field(description=_ALLOWED_SERVERS)
    allowed_tools: list[str] | None = Field(description=_ALLOWED_TOOLS)
    rate_limit: str | None = Field(description=_KEY_RATE_LIMIT)
    created_by_former_member: bool = Field(
        description="its creator is no longer a member (removed, left, or their account is "
        "gone). The key keeps working, as it belongs to the workspace, but that person saw "
        "its value: revoke it unless you know it is safe"
    )


class ApiKeyCreated(ApiKeyOut):
    key: str


_ALL_ROLES = frozenset(Role)
_MEMBER_ONLY = frozenset({Role.MEMBER})


def _user_id(principal: Principal) -> uuid.UUID:
    assert principal.user_id is not None  # workspace endpoints refuse API keys
    return principal.user_id


@routes.get(
    "/workspaces",
    summary="Workspaces of the current user",
    access=USER,
    response=list[WorkspaceOut],
)
async def list_workspaces(request: web.Request) -> list[dict[str, Any]]:
    return await workspaces_db.list_for_user(request.app[POOL], _user_id(request[PRINCIPAL]))


@routes.post(
    "/workspaces",
    summary="Create an org workspace (you become its owner)",
    access=USER,
    status=201,
    response=WorkspaceOut,
    errors=(400, 422),
)
async def create_workspace(request: web.Request, body: WorkspaceIn) -> dict[str, Any]:
    """Without `slug`, one is derived from the name. Slugs are unique across the service.

    A user who already belongs to GATEWAY_MAX_WORKSPACES_PER_USER workspaces (default 50,
    their personal one and those they joined included) cannot create another: 422."""
    pool = request.app[POOL]
    limit = request.app[SETTINGS].max_workspaces_per_user
    async with pool.acquire() as conn, conn.transaction():
        try:
            return await workspaces_db.create(
                conn,
                _user_id(request[PRINCIPAL]),
                body.name,
                body.slug,
                personal=False,
                limit=limit,
            )
        except AtBound:
            raise BoundReached(
                f"you belong to {limit} workspaces",
                "GATEWAY_MAX_WORKSPACES_PER_USER",
                "leave or delete one before creating another",
            ) from None


@routes.get(
    "/workspaces/{workspace_id}",
    summary="Workspace details",
    access=WS_MEMBER,
    response=WorkspaceOut,
)
async def get_workspace(request: web.Request, workspace_id: uuid.UUID) -> dict[str, Any]:
    workspace = await workspaces_db.get(
        request.app[POOL], workspace_id, _user_id(request[PRINCIPAL])
    )
    if workspace is None:
        raise NotFound("workspace not found")
    return workspace


@routes.patch(
    "/workspaces/{workspace_id}",
    summary="Rename a workspace or change its slug",
    access=WS_ADMIN,
    response=WorkspaceOut,
    errors=(400,),
)
async def update_workspace(
    request: web.Request, workspace_id: uuid.UUID, body: WorkspacePatch
) -> dict[str, Any]:
    workspace = await workspaces_db.update(
        request.app[POOL], workspace_id, _user_id(request[PRINCIPAL]), body.name, body.slug
    )
    if workspace is None:
        raise NotFound("workspace not found")
    return workspace


@routes.delete(
    "/workspaces/{workspace_id}",
    summary="Delete a workspace and all its data",
    access=WS_OWNER,
    errors=(400,),
)
async def delete_workspace(request: web.Request, workspace_id: uuid.UUID) -> None:
    """A personal workspace cannot be deleted."""
    if not await workspaces_db.delete(request.app[POOL], workspace_id):
        raise BadRequest("a personal workspace cannot be deleted")
    request.app[AUTHENTICATOR].forget_workspace(workspace_id)


@routes.get(
    "/workspaces/{workspace_id}/members",
    summary="Members and their roles",
    access=WS_MEMBER,
    response=list[MemberOut],
)
async def list_members(request: web.Request, workspace_id: uuid.UUID) -> list[dict[str, Any]]:
    return await memberships_db.list_members(request.app[POOL], workspace_id)


@routes.post(
    "/workspaces/{workspace_id}/members/invite",
    summary="Invite someone by email",
    access=WS_ADMIN,
    status=201,
    response=InviteCreated,
    errors=(400, 422, 429),
)
async def invite_member(
    request: web.Request, workspace_id: uuid.UUID, body: InviteIn
) -> dict[str, Any]:
    """Sends the invitation email (when SMTP_URL is configured). `invite_url` is returned only
    here. An earlier pending invitation of the same email to this workspace is replaced.

    Each invitation is an email to a stranger, so a workspace may create at most
    GATEWAY_INVITES_PER_HOUR (default 50) per hour, revoked and replaced ones included (429
    with Retry-After), and hold at most GATEWAY_MAX_PENDING_INVITES_PER_WORKSPACE (default
    200) pending (422). The email's subject is fixed; the names of the workspace and of the
    inviter appear in its body only."""
    app = request.app
    settings = app[SETTINGS]
    pool = app[POOL]
    inviter_id = _user_id(request[PRINCIPAL])
    bounds = invites_db.Bounds(
        settings.max_pending_invites_per_workspace, settings.invites_per_hour
    )
    async with pool.acquire() as conn, conn.transaction():
        if await memberships_db.is_member_by_email(conn, workspace_id, body.email):
            raise BadRequest(f"{body.email} is already a member of this workspace")
        invite_id = uuid.uuid4()
        token = invite_token(settings.jwt_secret, invite_id)
        try:
            invite = await invites_db.replace(
                conn,
                bounds,
                invite_id,
                workspace_id,
                body.email,
                body.role,
                hash_token(token),
                inviter_id,
                settings.invite_ttl_days,
            )
        except invites_db.SendingTooFast as exc:
            raise TooManyRequests(
                f"this workspace sent {bounds.per_hour} invitations in the last hour, the most "
                f"this gateway allows (GATEWAY_INVITES_PER_HOUR): retry in {exc.retry_after} s",
                retry_after=exc.retry_after,
            ) from None
        except AtBound:
            raise BoundReached(
                f"this workspace has {bounds.max_pending} pending invitations",
                "GATEWAY_MAX_PENDING_INVITES_PER_WORKSPACE",
                "revoke some first",
            ) from None
        workspace = await workspaces_db.get(conn, workspace_id, inviter_id)
        inviter = await users_db.by_id(conn, inviter_id)
    assert workspace is not None and inviter is not None
    invite["invite_url"] = f"{app[SETTINGS].base_url}/invite/{token}"
    app[MAILER].send_invite(body.email, workspace["name"], inviter.name, invite["invite_url"])
    return invite


@routes.patch(
    "/workspaces/{workspace_id}/members/{user_id}",
    summary="Change a member's role",
    access=WS_OWNER,
    response=MemberOut,
    errors=(400,),
)
async def update_member(
    request: web.Request, workspace_id: uuid.UUID, user_id: uuid.UUID, body: MemberPatch
) -> dict[str, Any]:
    """The last owner cannot be demoted (400)."""
    pool = request.app[POOL]
    try:
        found = await memberships_db.set_role(pool, workspace_id, user_id, body.role)
    except memberships_db.LastOwner:
        raise BadRequest("a workspace must keep at least one owner") from None
    if not found:
        raise NotFound("member not found")
    request.app[AUTHENTICATOR].forget_membership(workspace_id, user_id)
    member = await memberships_db.get_member(pool, workspace_id, user_id)
    if member is None:
        raise NotFound("member not found")
    return member


@routes.delete(
    "/workspaces/{workspace_id}/members/{user_id}",
    summary="Remove a member",
    access=WS_ADMIN,
    errors=(400,),
)
async def remove_member(request: web.Request, workspace_id: uuid.UUID, user_id: uuid.UUID) -> None:
    """Owners may remove anyone (except the last owner); admins may remove members only."""
    removable = _ALL_ROLES if request[PRINCIPAL].role is Role.OWNER else _MEMBER_ONLY
    try:
        found = await memberships_db.remove(request.app[POOL], workspace_id, user_id, removable)
    except memberships_db.LastOwner:
        raise BadRequest("a workspace must keep at least one owner") from None
    except memberships_db.Outranked:
        raise Forbidden("admins can only remove members; ask an owner") from None
    if not found:
        raise NotFound("member not found")
    request.app[AUTHENTICATOR].forget_membership(workspace_id, user_id)


@routes.get(
    "/workspaces/{workspace_id}/invites",
    summary="Pending invitations",
    access=WS_MEMBER,
    response=list[InviteOut],
)
async def list_invites(request: web.Request, workspace_id: uuid.UUID) -> list[dict[str, Any]]:
    return await invites_db.list_pending(request.app[POOL], workspace_id)


@routes.delete(
    "/workspaces/{workspace_id}/invites/{invite_id}",
    summary="Revoke a pending invitation",
    access=WS_ADMIN,
)
async def revoke_invite(
    request: web.Request, workspace_id: uuid.UUID, invite_id: uuid.UUID
) -> None:
    if not await invites_db.revoke(request.app[POOL], workspace_id, invite_id):
        raise NotFound("invite not found")


@routes.get(
    "/workspaces/{workspace_id}/api-keys",
    summary="API keys (never their values)",
    access=WS_MEMBER,
    response=list[ApiKeyOut],
)
async def list_api_keys(request: web.Request, workspace_id: uuid.UUID) -> list[dict[str, Any]]:
    """Keys belong to the workspace, not to the person who created them: a key keeps working
    when its creator leaves or is removed, because agents in production depend on it. That
    person saw the raw value, though, so such a key is listed with `created_by_former_member`
    true (the dashboard's Settings warn by its revoke button): revoke it unless you know it is
    safe."""
    return await api_keys_db.list_active(request.app[POOL], workspace_id)


@routes.post(
    "/workspaces/{workspace_id}/api-keys",
    summary="Create an API key",
    access=WS_ADMIN,
    status=201,
    response=ApiKeyCreated,
    errors=(422,),
)
async def create_api_key(
    request: web.Request, workspace_id: uuid.UUID, body: ApiKeyIn
) -> dict[str, Any]:
    """The raw `key` is in this response only; it is stored as a hash and cannot be shown
    again. Send it as `X-API-Key`. A workspace holds at most GATEWAY_MAX_API_KEYS_PER_WORKSPACE
    (default 100) active keys: 422 past it."""
    raw = new_api_key()
    limit = request.app[SETTINGS].max_api_keys_per_workspace
    async with request.app[POOL].acquire() as conn:
        try:
            created = await api_keys_db.insert(
                conn,
                workspace_id,
                body.name,
                raw[:DISPLAY_PREFIX_LENGTH],
                hash_token(raw),
                _user_id(request[PRINCIPAL]),
                body.rules(),
                limit,
            )
        except api_keys_db.UnknownServers as exc:
            raise _unknown_servers(exc) from None
        except AtBound:
            raise BoundReached(
                f"this workspace has {limit} API keys",
                "GATEWAY_MAX_API_KEYS_PER_WORKSPACE",
                "revoke one first",
            ) from None
    created["key"] = raw
    return created


@routes.patch(
    "/workspaces/{workspace_id}/api-keys/{key_id}",
    summary="Change an API key's scope and rate limit",
    access=WS_ADMIN,
    response=ApiKeyOut,
    errors=(422,),
)
async def update_api_key(
    request: web.Request, workspace_id: uuid.UUID, key_id: uuid.UUID, body: ApiKeyPatch
) -> dict[str, Any]:
    """Only the fields sent change; every gateway process applies the new rules within
    moments (the key is reloaded on its next request)."""
    given = body.model_fields_set
    wanted = body.rules()

    def change(current: api_keys_db.KeyRules) -> api_keys_db.KeyRules:
        return api_keys_db.KeyRules(
            **{
                field: getattr(wanted if field in given else current, field)
                for field in ("permissions", "allowed_servers", "allowed_tools", "rate_limit")
            }
        )

    async with request.app[POOL].acquire() as conn:
        try:
            updated = await api_keys_db.update_rules(
                conn, workspace_id, key_id, change, name=body.name
            )
        except api_keys_db.UnknownServers as exc:
            raise _unknown_servers(exc) from None
    if updated is None:
        raise NotFound("API key not found")
    # At once in this process (the others hear it through NOTIFY), as for a revoke.
    request.app[AUTHENTICATOR].keys.drop(updated.pop("key_hash"))
    return updated


def _unknown_servers(exc: api_keys_db.UnknownServers) -> ValidationFailed:
    return ValidationFailed(
        f"body.allowed_servers: not servers of this workspace: {', '.join(map(str, exc.ids))}"
    )


@routes.delete(
    "/workspaces/{workspace_id}/api-keys/{key_id}", summary="Revoke an API key", access=WS_ADMIN
)
async def revoke_api_key(request: web.Request, workspace_id: uuid.UUID, key_id: uuid.UUID) -> None:
    """Immediate and irreversible, in every gateway process."""
    key_hash = await api_keys_db.revoke(request.app[POOL], workspace_id, key_id)
    if key_hash is None:
        raise NotFound("API key not found")
    request.app[AUTHENTICATOR].keys.drop(key_hash)
