"""Servers: the registry with its filters, registering and editing (credentials go in, never
come back out), a server's probes, its tool rules (disabled tools, rate limit), and the tool
playground."""

from __future__ import annotations

import json
import uuid
from typing import Any, get_args

import orjson
from aiohttp import web

from gateway.api import health as health_api
from gateway.api import servers as servers_api
from gateway.api import tools as tools_api
from gateway.api.health import ChecksQuery
from gateway.api.models import ServerStatus
from gateway.api.servers import ServerIn, ServerPatch, ServerQuery
from gateway.api.tools import InvokeIn
from gateway.dashboard.connect import connect_panel
from gateway.dashboard.pages import (
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
from gateway.errors import ApiError, BadGateway, GatewayTimeout

pages = Pages()

AUTH_TYPES = {"": "None", "bearer": "Bearer token", "api_key": "API key header", "basic": "Basic"}
# The form's credential inputs for each auth_type, by the API's field names.
_CREDENTIAL_FIELDS = {
    "bearer": ("token",),
    "api_key": ("header_name", "header_value"),
    "basic": ("username", "password"),
}
STATUSES = get_args(ServerStatus)


@pages.get("/servers", "servers.html")
async def server_list(request: web.Request) -> dict[str, Any]:
    filters = {k: v for k in ("status", "tag", "search") if (v := request.query.get(k, "").strip())}
    try:
        query = validated(ServerQuery, filters)
    except FormInvalid as exc:
        return {
            "section": "servers",
            "servers": [],
            "filters": filters,
            "statuses": STATUSES,
            "errors": exc.errors,
        }
    servers = await call(request, servers_api.list_servers, query=query)
    return {
        "section": "servers",
        "servers": servers,
        "filters": filters,
        "statuses": STATUSES,
        "errors": {},
    }


# -- register and edit ------------------------------------------------------------------------


def _submitted(request: web.Request) -> dict[str, Any]:
    """The form as the API's body: tags split, the credentials of the chosen auth_type."""
    values: dict[str, Any] = {
        name: field_text(request, name) for name in ("name", "url", "description")
    }
    values["tags"] = [t.strip() for t in field_text(request, "tags").split(",") if t.strip()]
    auth_type = field_text(request, "auth_type") or None
    values["auth_type"] = auth_type
    if auth_type in _CREDENTIAL_FIELDS:
        typed = {name: field_text(request, name) for name in _CREDENTIAL_FIELDS[auth_type]}
        # Empty on an edit: keep the stored ones (they are never shown, so never refilled).
        values["auth_credentials"] = typed if any(typed.values()) else None
    return values


def _shown(values: dict[str, Any]) -> dict[str, Any]:
    """What a form shows again: never a credential."""
    return {
        "name": values.get("name", ""),
        "url": values.get("url", ""),
        "description": values.get("description", ""),
        "tags": ", ".join(values.get("tags") or []),
        "auth_type": values.get("auth_type") or "",
    }


def _form_context(
    values: dict[str, Any], errors: dict[str, str], server: dict[str, Any] | None
) -> dict[str, Any]:
    # Credentials are named auth_credentials.<field> in the API's messages.
    errors = {k.removeprefix("auth_credentials."): v for k, v in errors.items()}
    return {
        "section": "servers",
        "values": _shown(values),
        "errors": errors,
        "server": server,
        "auth_types": AUTH_TYPES,
    }


@pages.get("/servers/new", "server_form.html")
async def new_server_form(request: web.Request) -> dict[str, Any]:
    await authorize(request, servers_api.create_server)
    return _form_context({}, {}, None)


@pages.post("/servers/new")
async def register_server(request: web.Request) -> web.StreamResponse:
    await authorize(request, servers_api.create_server)
    values = _submitted(request)
    try:
        body = validated(ServerIn, values)
        created = await call(request, servers_api.create_server, body=body)
    except FormInvalid as exc:
        return await _form_page(request, values, exc.errors, 422, None)
    except ApiError as exc:
        if exc.status not in (400, 422):
            raise
        return await _form_page(request, values, api_errors(exc), exc.status, None)
    return redirect(f"/servers/{created['id']}")


@pages.get("/servers/{server_id}/edit", "server_form.html")
async def edit_server_form(request: web.Request) -> dict[str, Any]:
    await authorize(request, servers_api.update_server)
    server = await _server(request)
    return _form_context(server, {}, server)


@pages.post("/servers/{server_id}/edit")
async def edit_server(request: web.Request) -> web.StreamResponse:
    server_id = path_id(request, "server_id", "server")
    await authorize(request, servers_api.update_server)
    values = _submitted(request)
    try:
        # An auth_type of None clears the stored credentials, as in the API.
        body = validated(ServerPatch, values)
        await call(request, servers_api.update_server, server_id=server_id, body=body)
    except FormInvalid as exc:
        server = await _server(request)
        return await _form_page(request, values, exc.errors, 422, server)
    except ApiError as exc:
        if exc.status not in (400, 422):
            raise
        server = await _server(request)
        return await _form_page(request, values, api_errors(exc), exc.status, server)
    return redirect(f"/servers/{server_id}")


@pages.post("/servers/{server_id}/delete")
async def delete_server(request: web.Request) -> web.StreamResponse:
    server_id = path_id(request, "server_id", "server")
    await call(request, servers_api.delete_server, server_id=server_id)
    return redirect("/servers")


async def _form_page(
    request: web.Request,
    values: dict[str, Any],
    errors: dict[str, str],
    status: int,
    server: dict[str, Any] | None,
) -> web.StreamResponse:
    return await render(
        request, "server_form.html", _form_context(values, errors, server), status=status
    )


# -- tool rules -------------------------------------------------------------------------------


def _rules_form(request: web.Request) -> dict[str, Any]:
    """The rules form as typed: tools checked in the picker, more patterns, the rate limit."""
    return {
        "picked": field_values(request, "disabled_tool"),
        "patterns": field_text(request, "disabled_patterns"),
        "rate_limit": field_text(request, "rate_limit"),
    }


def _disabled_tools(values: dict[str, Any]) -> list[str]:
    """Each tool checked is its exact name as a pattern; the textarea holds one a line."""
    typed = [line.strip() for line in values["patterns"].splitlines() if line.strip()]
    return list(dict.fromkeys([*values["picked"], *typed]))


def _rules_values(server: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The stored rules as the form shows them: a pattern that is the name of a listed tool is
    its checkbox, every other one (globs, tools no longer listed) a line of the textarea."""
    names = {tool["name"] for tool in tools}
    disabled = server["disabled_tools"]
    return {
        "picked": [p for p in disabled if p in names],
        "patterns": "\n".join(p for p in disabled if p not in names),
        "rate_limit": server["rate_limit"] or "",
    }


async def _tool_list(
    request: web.Request, server_id: uuid.UUID
) -> tuple[list[dict[str, Any]], str | None]:
    """The server's tools (the playground's cached list), or why it could not be read."""
    try:
        listing = await call(request, tools_api.list_tools, server_id=server_id)
    except ApiError as exc:
        if exc.status not in (429, 502, 504):  # the server's trouble, or a busy gateway
            raise
        return [], exc.detail
    tools: list[dict[str, Any]] = listing["tools"]
    return tools, None


async def _rules_page(
    request: web.Request,
    server: dict[str, Any],
    values: dict[str, Any] | None,
    errors: dict[str, str],
    status: int = 200,
) -> web.StreamResponse:
    tools, problem = await _tool_list(request, server["id"])
    if values is not None:
        # Tools checked on a list that cannot be read now: kept, as lines of the textarea.
        names = {tool["name"] for tool in tools}
        unseen = [name for name in values["picked"] if name not in names]
        if unseen:
            lines = [*unseen, *values["patterns"].splitlines()]
            picked = [name for name in values["picked"] if name in names]
            values = {**values, "picked": picked, "patterns": "\n".join(lines)}
    context = {
        "section": "servers",
        "server": server,
        "tools": tools,
        "problem": problem,
        "values": _rules_values(server, tools) if values is None else values,
        "errors": errors,
    }
    return await render(request, "server_rules.html", context, status=status)


@pages.get("/servers/{server_id}/rules")
async def rules_form(request: web.Request) -> web.StreamResponse:
    await authorize(request, servers_api.update_server)
    return await _rules_page(request, await _server(request), None, {})


@pages.post("/servers/{server_id}/rules")
async def save_rules(request: web.Request) -> web.StreamResponse:
    server_id = path_id(request, "server_id", "server")
    await authorize(request, servers_api.update_server)
    values = _rules_form(request)
    patterns = _disabled_tools(values)
    body = {"disabled_tools": patterns, "rate_limit": values["rate_limit"].strip() or None}
    try:
        patch = validated(ServerPatch, body)
        await call(request, servers_api.update_server, server_id=server_id, body=patch)
    except FormInvalid as exc:
        errors = exc.errors
    except ApiError as exc:
        if exc.status not in (400, 422):
            raise
        errors = api_errors(exc)
    else:
        return redirect(f"/servers/{server_id}")
    errors = field_errors(errors, {"disabled_tools": patterns})
    return await _rules_page(request, await _server(request), values, errors, 422)


# -- one server -------------------------------------------------------------------------------


@pages.get("/servers/{server_id}", "server.html")
async def server_page(request: web.Request) -> dict[str, Any]:
    server = await _server(request)
    checks = await call(
        request, health_api.list_checks, query=ChecksQuery(server_id=server["id"], limit=20)
    )
    return {
        "section": "servers",
        "server": server,
        "checks": checks,
        "connect": connect_panel(server["name"], server["proxy_url"]),
    }


@pages.post("/servers/{server_id}/probe")
async def probe_now(request: web.Request) -> web.StreamResponse:
    server_id = path_id(request, "server_id", "server")
    await call(request, servers_api.probe_server, server_id=server_id)
    return redirect(f"/servers/{server_id}")


# -- the playground ---------------------------------------------------------------------------


@pages.get("/servers/{server_id}/tools", "playground.html")
async def playground(request: web.Request) -> dict[str, Any]:
    return await _playground(request, path_id(request, "server_id", "server"))


@pages.post("/servers/{server_id}/tools/invoke")
async def invoke(request: web.Request) -> web.StreamResponse:
    server_id = path_id(request, "server_id", "server")
    await authorize(request, tools_api.invoke_tool)
    tool_name = field_text(request, "tool_name")
    raw = field_text(request, "arguments").strip() or "{}"
    errors: dict[str, str] = {}
    outcome = None
    refusal: ApiError | None = None
    try:
        # orjson: standard JSON only (no NaN), and a nesting limit instead of a RecursionError.
        arguments = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        errors["arguments"] = f"not valid JSON: {exc}"
    else:
        try:
            body = validated(InvokeIn, {"tool_name": tool_name, "arguments": arguments})
            outcome = await call(request, tools_api.invoke_tool, server_id=server_id, body=body)
        except FormInvalid as exc:
            errors = exc.errors
        except ApiError as exc:
            # The server's rules refused the call (a disabled tool, its rate limit): said on
            # the tool's form. The role was checked above, so a 403 here is a refusal.
            if exc.status in (403, 429):
                refusal = exc
                errors = {"": exc.detail}
            elif exc.status == 422:
                errors = api_errors(exc)
            else:
                raise
    # A schema's complaints name the argument (arguments.a): all of them go next to the field.
    about_arguments = [
        f"{k.removeprefix('arguments.')}: {v}" if k != "arguments" else v
        for k, v in errors.items()
        if k == "arguments" or k.startswith("arguments.")
    ]
    errors = {k: v for k, v in errors.items() if not k.startswith("arguments")}
    if about_arguments:
        errors["arguments"] = "; ".join(about_arguments)
    context = await _playground(request, server_id)
    context.update(
        invoked=tool_name,
        arguments=raw,
        outcome=outcome,
        outcome_json=None if outcome is None else _pretty(outcome["result"]),
        errors=errors,
    )
    status = refusal.status if refusal else 422 if errors else 200
    response = await render(request, "playground.html", context, status=status)
    if refusal is not None:
        response.headers.update(refusal.headers)  # Retry-After
    return response


@pages.post("/servers/{server_id}/tools/refresh")
async def refresh_tools(request: web.Request) -> web.StreamResponse:
    server_id = path_id(request, "server_id", "server")
    await call(request, tools_api.drop_tools_cache, server_id=server_id)
    return redirect(f"/servers/{server_id}/tools")


async def _playground(request: web.Request, server_id: uuid.UUID) -> dict[str, Any]:
    server = await call(request, servers_api.get_server, server_id=server_id)
    listing, problem = None, None
    try:
        listing = await call(request, tools_api.list_tools, server_id=server_id)
    except (BadGateway, GatewayTimeout) as exc:  # the server's trouble, shown on the page
        problem = exc.detail
    tools = [] if listing is None else listing["tools"]
    return {
        "section": "servers",
        "server": server,
        "listing": listing,
        "problem": problem,
        "tools": [
            {
                **tool,
                "schema_json": _pretty(tool["inputSchema"]),
                "parameters": _parameters(tool["inputSchema"]),
                "skeleton": _skeleton(tool["inputSchema"]),
            }
            for tool in tools
        ],
        "invoked": None,
        "arguments": "{}",
        "outcome": None,
        "outcome_json": None,
        "errors": {},
    }


# -- helpers ----------------------------------------------------------------------------------


async def _server(request: web.Request) -> dict[str, Any]:
    server_id = path_id(request, "server_id", "server")
    server: dict[str, Any] = await call(request, servers_api.get_server, server_id=server_id)
    return server


_EMPTY = {"string": "", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}


def _properties(schema: Any) -> dict[str, Any]:
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return properties if isinstance(properties, dict) else {}


def _parameters(schema: Any) -> list[dict[str, Any]]:
    """The arguments a tool declares, for a person to read: name, type, required, description."""
    # The server's schema, not ours: anything may be in it.
    required = schema.get("required") if isinstance(schema, dict) else None
    needed = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    return [
        {
            "name": name,
            "type": _text(spec.get("type", "any")) if isinstance(spec, dict) else "any",
            "required": name in needed,
            "description": _text(spec.get("description", "")) if isinstance(spec, dict) else "",
        }
        for name, spec in _properties(schema).items()
    ]


def _text(value: Any) -> str:
    """A schema's word for people: a type may be a list (["string", "null"])."""
    if isinstance(value, list):
        return " or ".join(str(v) for v in value)
    return str(value)


def _skeleton(schema: Any) -> str:
    """Arguments to start from: each required one with an empty value of its type."""
    return _pretty(
        {
            p["name"]: _EMPTY.get(p["type"]) if isinstance(p["type"], str) else None
            for p in _parameters(schema)
            if p["required"]
        }
    )


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
