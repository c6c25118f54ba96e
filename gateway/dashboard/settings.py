"""Workspace settings: the workspace itself, its members and invitations, its API keys and
what each may do (its scope), and the apps its members connected with OAuth (admins)."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
from aiohttp import web

from gateway.accounts.access import Role
from gateway.api import servers as servers_api
from gateway.api import workspaces as workspaces_api
from gateway.api.servers import ServerQuery
from gateway.api.workspaces import (
    ApiKeyIn,
    ApiKeyPatch,
    InviteIn,
    MemberPatch,
    WorkspaceIn,
    WorkspacePatch,
)
from gateway.dashboard.account import connected_apps
from gateway.dashboard.filters import plural
from gateway.dashboard.pages import (
    ROLE,
    FormInvalid,
    Pages,
    api_errors,
    authorize,
    call,
    field_errors,
    field_text,
    field_values,
    path_id,
    redirect,
    render,
    validated,
)
from gateway.dashboard.sessions import SESSION
from gateway.db import dashboard_sessions as sessions_db
from gateway.db import oauth_grants as grants_db
from gateway.errors import DUPLICATES, ApiError, NotFound
from gateway.keys import POOL, SETTINGS
from gateway.policy.rules import PERMISSIONS

pages = Pages()

# The API lets the middleware turn this constraint into a 400; a form wants it by the field.
_SLUG_TAKEN = "workspaces_slug_key"


def _workspace_id(request: web.Request) -> uuid.UUID:
    workspace_id = request[SESSION].workspace_id
    assert workspace_id is not None  # set by the pages' wrapper for every signed-in page
    return workspace_id


async def _context(
    request: web.Request,
    *,
    failed: str = "",
    errors: dict[str, str] | None = None,
    values: dict[str, Any] | None = None,
    invite: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The settings page; `failed` names the form whose `errors` and typed `values` it shows
    again."""
    workspace_id = _workspace_id(request)
    workspace = await call(request, workspaces_api.get_workspace, workspace_id=workspace_id)
    members = await call(request, workspaces_api.list_members, workspace_id=workspace_id)
    invites = await call(request, workspaces_api.list_invites, workspace_id=workspace_id)
    api_keys = await call(request, workspaces_api.list_api_keys, workspace_id=workspace_id)
    # Lists carry user ids only; people who left are no longer among the members.
    names = {member["user_id"]: member["name"] for member in members}
    for item in invites:
        item["invited_by_name"] = names.get(item["invited_by"])
    for item in api_keys:
        item["created_by_name"] = names.get(item["created_by"])
        item["scope"] = scope_summary(item)
    # The create form's server checkboxes, and every member's connected apps: admins only.
    is_admin = request[ROLE].rank >= Role.ADMIN.rank
    servers = await _servers(request) if is_admin else []
    grants: list[dict[str, Any]] = []
    if is_admin:
        grants = await grants_db.list_for_workspace(request.app[POOL], workspace_id)
    return {
        "section": "settings",
        "workspace": workspace,
        "members": members,
        "invites": invites,
        "api_keys": api_keys,
        "servers": servers,
        "connected_apps": connected_apps(grants, workspace_id),
        "new_key": _NEW_KEY,
        "me": request[SESSION].user_id,
        "failed": failed,
        "errors": errors or {},
        "values": values or {},
        "invite": invite,
        "emails_sent": request.app[SETTINGS].smtp_url is not None,
    }


async def _refused(
    request: web.Request,
    status: int,
    failed: str,
    errors: dict[str, str],
    values: dict[str, Any] | None = None,
) -> web.StreamResponse:
    """The settings page again, with why the form `failed` was refused."""
    context = await _context(request, failed=failed, errors=errors, values=values)
    return await render(request, "settings.html", context, status=status)


def _message(errors: dict[str, str]) -> dict[str, str]:
    """Form errors as one message above a form that has no field of that name to show them."""
    return {"": " ".join(errors.values())}


@pages.get("/settings", "settings.html")
async def settings_page(request: web.Request) -> dict[str, Any]:
    return await _context(request)


@pages.post("/settings/workspace")
async def rename_workspace(request: web.Request) -> web.StreamResponse:
    workspace_id = _workspace_id(request)
    await authorize(request, workspaces_api.update_workspace, workspace_id=workspace_id)
    values = {name: field_text(request, name) for name in ("name", "slug")}
    try:
        body = validated(WorkspacePatch, values)
        await call(request, workspaces_api.update_workspace, workspace_id=workspace_id, body=body)
    except FormInvalid as exc:
        return await _refused(request, 422, "workspace", exc.errors, values)
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name != _SLUG_TAKEN:
            raise
        errors = {"slug": DUPLICATES[_SLUG_TAKEN]}
        return await _refused(request, 400, "workspace", errors, values)
    return redirect("/settings")


@pages.post("/settings/delete")
async def delete_workspace(request: web.Request) -> web.StreamResponse:
    try:
        await call(request, workspaces_api.delete_workspace, workspace_id=_workspace_id(request))
    except ApiError as exc:
        if exc.status != 400:  # a personal workspace; 403 stays the error page
            raise
        return await _refused(request, 400, "delete", {"": exc.detail})
    # The session's workspace is gone with it: the next page is the home workspace.
    return redirect("/")


@pages.post("/settings/members/{user_id}/role")
async def change_role(request: web.Request) -> web.StreamResponse:
    user_id = path_id(request, "user_id", "member")
    workspace_id = _workspace_id(request)
    await authorize(request, workspaces_api.update_member, workspace_id=workspace_id)
    try:
        body = validated(MemberPatch, {"role": field_text(request, "role")})
        await call(
            request,
            workspaces_api.update_member,
            workspace_id=workspace_id,
            user_id=user_id,
            body=body,
        )
    except FormInvalid as exc:
        return await _refused(request, 422, "members", _message(exc.errors))
    except ApiError as exc:
        if exc.status != 400:  # the last owner; 403 and 404 stay error pages
            raise
        return await _refused(request, 400, "members", {"": exc.detail})
    return redirect("/settings")


@pages.post("/settings/members/{user_id}/remove")
async def remove_member(request: web.Request) -> web.StreamResponse:
    user_id = path_id(request, "user_id", "member")
    try:
        await call(
            request,
            workspaces_api.remove_member,
            workspace_id=_workspace_id(request),
            user_id=user_id,
        )
    except ApiError as exc:
        if exc.status != 400:
            raise
        return await _refused(request, 400, "members", {"": exc.detail})
    return redirect("/settings")


@pages.post("/settings/invites")
async def invite_member(request: web.Request) -> web.StreamResponse:
    workspace_id = _workspace_id(request)
    await authorize(request, workspaces_api.invite_member, workspace_id=workspace_id)
    values = {name: field_text(request, name) for name in ("email", "role")}
    try:
        body = validated(InviteIn, values)
        invite = await call(
            request, workspaces_api.invite_member, workspace_id=workspace_id, body=body
        )
    except FormInvalid as exc:
        return await _refused(request, 422, "invite", exc.errors, values)
    except ApiError as exc:
        # Already a member (400), too many pending (422), too many this hour (429); 403 stays
        # the error page.
        if exc.status not in (400, 422, 429):
            raise
        response = await _refused(request, exc.status, "invite", api_errors(exc), values)
        response.headers.update(exc.headers)  # Retry-After
        return response
    # Shown here only, not after a redirect: the link is a secret that opens the workspace,
    # and a URL would keep it in the history; without SMTP_URL it is the only way to send it.
    context = await _context(request, invite=invite)
    return await render(request, "settings.html", context, status=201)


@pages.post("/settings/invites/{invite_id}/revoke")
async def revoke_invite(request: web.Request) -> web.StreamResponse:
    await call(
        request,
        workspaces_api.revoke_invite,
        workspace_id=_workspace_id(request),
        invite_id=path_id(request, "invite_id", "invite"),
    )
    return redirect("/settings")


@pages.post("/settings/api-keys")
async def create_api_key(request: web.Request) -> web.StreamResponse:
    workspace_id = _workspace_id(request)
    await authorize(request, workspaces_api.create_api_key, workspace_id=workspace_id)
    values = _key_form(request)
    try:
        body = validated(ApiKeyIn, _key_body(values))
        created = await call(
            request, workspaces_api.create_api_key, workspace_id=workspace_id, body=body
        )
    except FormInvalid as exc:
        return await _refused(request, 422, "api_key", _key_errors(exc.errors, values), values)
    except ApiError as exc:
        # As many keys as a workspace may hold, or a server deleted since the page was shown.
        if exc.status != 422:
            raise
        errors = _key_errors(api_errors(exc), values)
        return await _refused(request, 422, "api_key", errors, values)
    # The raw key exists in this response only (stored as a hash): never behind a redirect.
    context = {"section": "settings", "api_key": created}
    return await render(request, "api_key_created.html", context, status=201)


# -- an API key's scope -------------------------------------------------------------------------

# The create form as it first shows: a key that may do everything, as the API's default.
_NEW_KEY: dict[str, Any] = {
    "name": "",
    "scoped": True,
    "permissions": list(PERMISSIONS),
    "servers": "all",
    "allowed_servers": [],
    "allowed_tools": "",
    "rate_limit": "",
}


def scope_summary(key: dict[str, Any]) -> str:
    """What a key may do, in short: "proxy, read · 2 servers · read_* · 100/minute", or
    "everything" for a key no rule restricts."""
    parts = []
    if set(key["permissions"]) != set(PERMISSIONS):
        parts.append(", ".join(key["permissions"]) or "no permissions")
    servers = key["allowed_servers"]
    if servers is not None:
        parts.append(plural(len(servers), "server") if servers else "no servers")
    tools = key["allowed_tools"]
    if tools is not None:
        shown = ", ".join(tools[:3]) + (f" +{len(tools) - 3} more" if len(tools) > 3 else "")
        parts.append(shown or "no tools")
    if key["rate_limit"]:
        parts.append(key["rate_limit"])
    return " · ".join(parts) or "everything"


def _key_form(request: web.Request) -> dict[str, Any]:
    """A key form as typed (what it shows again when refused)."""
    return {
        "name": field_text(request, "name"),
        # Unchecked boxes send nothing: the marker tells "no permission" from a form without
        # the scope's fields (which keeps the API's defaults, or on an edit the stored scope).
        "scoped": field_text(request, "scope") == "1",
        "permissions": field_values(request, "permissions"),
        "servers": "only" if field_text(request, "servers") == "only" else "all",
        "allowed_servers": field_values(request, "allowed_servers"),
        "allowed_tools": field_text(request, "allowed_tools"),
        "rate_limit": field_text(request, "rate_limit"),
    }


def _key_body(values: dict[str, Any]) -> dict[str, Any]:
    """A key form as the API's body. Empty means no restriction: every server (unless "only
    these" is chosen, where none checked is none), every tool (one pattern a line), no rate
    limit."""
    if not values["scoped"]:
        return {"name": values["name"]}
    if values["servers"] == "all" and values["allowed_servers"]:
        # Servers checked under "all servers" (the page's script unchecks them; without it):
        # either reading could be wrong, and a key's reach is not for guessing.
        raise FormInvalid(
            {
                "allowed_servers": 'servers are checked but "All servers" is chosen: choose '
                '"Only the servers checked" to limit the key to them, or uncheck them'
            }
        )
    return {
        "name": values["name"],
        "permissions": values["permissions"],
        "allowed_servers": values["allowed_servers"] if values["servers"] == "only" else None,
        "allowed_tools": _patterns(values["allowed_tools"]) or None,
        "rate_limit": values["rate_limit"].strip() or None,
    }


def _patterns(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _key_errors(errors: dict[str, str], values: dict[str, Any]) -> dict[str, str]:
    return field_errors(errors, {"allowed_tools": _patterns(values["allowed_tools"])})


def _key_values(key: dict[str, Any]) -> dict[str, Any]:
    """A stored key as its form shows it."""
    return {
        "name": key["name"],
        "scoped": True,
        "permissions": key["permissions"],
        "servers": "all" if key["allowed_servers"] is None else "only",
        "allowed_servers": [str(s) for s in key["allowed_servers"] or ()],
        "allowed_tools": "\n".join(key["allowed_tools"] or ()),
        "rate_limit": key["rate_limit"] or "",
    }


async def _servers(request: web.Request) -> list[dict[str, Any]]:
    servers: list[dict[str, Any]] = await call(
        request, servers_api.list_servers, query=ServerQuery()
    )
    return servers


async def _api_key(request: web.Request, key_id: uuid.UUID) -> dict[str, Any]:
    keys = await call(request, workspaces_api.list_api_keys, workspace_id=_workspace_id(request))
    found: dict[str, Any] | None = next((key for key in keys if key["id"] == key_id), None)
    if found is None:
        raise NotFound("API key not found")
    return found


async def _key_page(
    request: web.Request,
    key: dict[str, Any],
    values: dict[str, Any],
    errors: dict[str, str],
    status: int = 200,
) -> web.StreamResponse:
    context = {
        "section": "settings",
        "key": key,
        "values": values,
        "errors": errors,
        "servers": await _servers(request),
    }
    return await render(request, "api_key_form.html", context, status=status)


@pages.get("/settings/api-keys/{key_id}/edit")
async def edit_api_key_form(request: web.Request) -> web.StreamResponse:
    key_id = path_id(request, "key_id", "API key")
    workspace_id = _workspace_id(request)
    await authorize(request, workspaces_api.update_api_key, workspace_id=workspace_id)
    key = await _api_key(request, key_id)
    return await _key_page(request, key, _key_values(key), {})


@pages.post("/settings/api-keys/{key_id}/edit")
async def edit_api_key(request: web.Request) -> web.StreamResponse:
    key_id = path_id(request, "key_id", "API key")
    workspace_id = _workspace_id(request)
    await authorize(request, workspaces_api.update_api_key, workspace_id=workspace_id)
    values = _key_form(request)
    try:
        # Every field of the scope sent: what the form shows is what the key gets.
        body = validated(ApiKeyPatch, _key_body(values))
        await call(
            request,
            workspaces_api.update_api_key,
            workspace_id=workspace_id,
            key_id=key_id,
            body=body,
        )
    except FormInvalid as exc:
        errors = _key_errors(exc.errors, values)
    except ApiError as exc:
        if exc.status != 422:  # 404: revoked meanwhile, the error page says so
            raise
        errors = _key_errors(api_errors(exc), values)
    else:
        return redirect("/settings#api-keys")
    return await _key_page(request, await _api_key(request, key_id), values, errors, 422)


@pages.post("/settings/workspaces")
async def create_workspace(request: web.Request) -> web.StreamResponse:
    """A new org workspace (its creator its owner), shown at once."""
    values = {"name": field_text(request, "name")}
    try:
        body = validated(WorkspaceIn, values)
        created = await call(request, workspaces_api.create_workspace, body=body)
    except FormInvalid as exc:
        return await _refused(request, 422, "create", exc.errors, values)
    except ApiError as exc:
        if exc.status not in (400, 422):
            raise
        return await _refused(request, exc.status, "create", api_errors(exc), values)
    await sessions_db.switch(request.app[POOL], request[SESSION].id_hash, created["id"])
    return redirect("/settings")


@pages.post("/settings/api-keys/{key_id}/revoke")
async def revoke_api_key(request: web.Request) -> web.StreamResponse:
    await call(
        request,
        workspaces_api.revoke_api_key,
        workspace_id=_workspace_id(request),
        key_id=path_id(request, "key_id", "API key"),
    )
    return redirect("/settings")
