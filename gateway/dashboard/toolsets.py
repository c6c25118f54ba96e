"""Toolsets: the list, creating and editing one (ordered member servers, each with its prefix and
a picker of its tools), and a toolset's page with the tools it exposes and how to connect."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from aiohttp import web

from gateway.api import servers as servers_api
from gateway.api import tools as tools_api
from gateway.api import toolsets as toolsets_api
from gateway.api.servers import ServerQuery
from gateway.api.toolsets import ToolsetIn, ToolsetPatch
from gateway.dashboard.connect import connect_panel
from gateway.dashboard.pages import (
    FormInvalid,
    Pages,
    api_errors,
    authorize,
    call,
    field_text,
    field_values,
    path_id,
    redirect,
    render,
    validated,
)
from gateway.errors import ApiError
from gateway.toolsets.names import default_prefix

pages = Pages()

# The playground's answers that are the server's trouble (or a busy gateway), shown on the page.
_LISTING_TROUBLE = (429, 502, 504)


@pages.get("/toolsets", "toolsets.html")
async def toolset_list(request: web.Request) -> dict[str, Any]:
    toolsets = await call(request, toolsets_api.list_toolsets)
    servers = await _servers(request)
    return {
        "section": "toolsets",
        "toolsets": toolsets,
        "servers": {str(server["id"]): server for server in servers},
        "has_servers": bool(servers),
    }


# -- create and edit ------------------------------------------------------------------------------


def _patterns(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _rows_from_form(request: web.Request, servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every server of the workspace as the form sent it: in the toolset or not, its order,
    prefix, checked tools and patterns, as typed."""
    included = set(field_values(request, "member"))
    rows: list[dict[str, Any]] = []
    for server in servers:
        key = str(server["id"])
        rows.append(
            {
                "server": server,
                "included": key in included,
                "position": field_text(request, f"position.{key}").strip(),
                "prefix": field_text(request, f"prefix.{key}").strip(),
                "default_prefix": default_prefix(server["name"]),
                "picked": field_values(request, f"tool.{key}"),
                "patterns": field_text(request, f"patterns.{key}"),
            }
        )
    return rows


def _rows_from_toolset(
    toolset: dict[str, Any] | None, servers: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The stored toolset as the form shows it: its members first in order (with the prefix
    they get written out), then every other server of the workspace."""
    members: dict[str, dict[str, Any]] = {
        m["server_id"]: m for m in (toolset or {}).get("servers", [])
    }
    order = list(members)
    rows: list[dict[str, Any]] = []
    for server in servers:
        key = str(server["id"])
        member = members.get(key)
        default = default_prefix(server["name"])
        tools = None if member is None else member["tools"]
        rows.append(
            {
                "server": server,
                "included": member is not None,
                "position": str(order.index(key) + 1) if member is not None else "",
                "prefix": default
                if member is None or member["prefix"] is None
                else member["prefix"],
                "default_prefix": default,
                "picked": [],
                "patterns": "\n".join(tools or ()),
            }
        )
    return rows


def _members(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """The members the form asks for, in their order (those without one after the numbered
    ones, as listed), and the errors of orders that are not whole numbers, by server id."""
    errors: dict[str, dict[str, str]] = {}
    chosen = []
    for index, row in enumerate(rows):
        if not row["included"]:
            continue
        rank = _rank(row["position"])
        if row["position"] and rank == float("inf"):
            errors[str(row["server"]["id"])] = {"position": "a whole number, e.g. 1"}
        chosen.append((rank, index, row))
    chosen.sort(key=lambda item: (item[0], item[1]))
    members = []
    for _, _, row in chosen:
        patterns = list(dict.fromkeys([*row["picked"], *_patterns(row["patterns"])]))
        prefix = row["prefix"]
        members.append(
            {
                "server_id": str(row["server"]["id"]),
                # Nothing picked or written: every tool of the server.
                "tools": patterns or None,
                # The default written out stays the default: it follows the server's name.
                "prefix": None if prefix == row["default_prefix"] else prefix,
            }
        )
    return members, errors


# The member fields of the API's messages, as the form's fields of a server's block.
_ROW_FIELDS = {"server_id": "member", "tools": "patterns", "prefix": "prefix"}


def _row_errors(
    errors: dict[str, str], members: list[dict[str, Any]]
) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The API's errors split into the form's own and each server block's (by server id, then
    field): `servers.2.tools.0` goes to the third member's patterns, saying which one."""
    form_errors: dict[str, str] = {}
    by_row: dict[str, dict[str, str]] = {}
    for name, message in errors.items():
        parts = name.split(".")
        if parts[0] != "servers" or len(parts) < 3 or not parts[1].isdigit():
            form_errors[name] = message
            continue
        position = int(parts[1])
        if position >= len(members):
            form_errors["servers"] = message
            continue
        member = members[position]
        if parts[2] == "tools" and len(parts) == 4 and parts[3].isdigit():
            patterns = member["tools"] or []
            item = int(parts[3])
            message = f"{patterns[item] if item < len(patterns) else 'a tool'}: {message}"
        row = by_row.setdefault(member["server_id"], {})
        field = _ROW_FIELDS.get(parts[2], "member")
        row[field] = f"{row[field]} {message}" if field in row else message
    return form_errors, by_row


async def _tool_lists(
    request: web.Request, server_ids: list[str]
) -> dict[str, tuple[list[dict[str, Any]], str | None]]:
    """Each server's tools (the playground's cached lists, read at once), or why they could
    not be read."""

    async def one(server_id: str) -> tuple[list[dict[str, Any]], str | None]:
        try:
            listing = await call(request, tools_api.list_tools, server_id=uuid.UUID(server_id))
        except ApiError as exc:
            if exc.status not in _LISTING_TROUBLE:
                raise
            return [], exc.detail
        tools: list[dict[str, Any]] = listing["tools"]
        return tools, None

    listed = await asyncio.gather(*(one(server_id) for server_id in server_ids))
    return dict(zip(server_ids, listed, strict=True))


async def _form_page(
    request: web.Request,
    toolset: dict[str, Any] | None,
    values: dict[str, Any],
    rows: list[dict[str, Any]],
    errors: dict[str, str],
    row_errors: dict[str, dict[str, str]],
    status: int = 200,
) -> web.StreamResponse:
    """The form. The tools of the stored members are offered as checkboxes (their lists are
    read now); any other server takes patterns typed in until it is a member."""
    member_ids = [m["server_id"] for m in (toolset or {}).get("servers", [])]
    lists = await _tool_lists(request, member_ids)
    for row in rows:
        tools, problem = lists.get(str(row["server"]["id"]), (None, None))
        row["tools"], row["problem"] = tools, problem
        row["errors"] = row_errors.get(str(row["server"]["id"]), {})
        if tools:
            # Patterns that name a listed tool are its checkbox; the rest stay lines of text.
            names = {tool["name"] for tool in tools}
            written = list(dict.fromkeys([*row["picked"], *_patterns(row["patterns"])]))
            row["picked"] = [p for p in written if p in names]
            row["patterns"] = "\n".join(p for p in written if p not in names)
        elif row["picked"]:
            row["patterns"] = "\n".join([*row["picked"], *_patterns(row["patterns"])])
            row["picked"] = []
    # Members first, in their order; then the other servers as the registry lists them.
    rows.sort(key=lambda r: (not r["included"], _rank(r["position"])))
    context = {
        "section": "toolsets",
        "toolset": toolset,
        "values": values,
        "rows": rows,
        "errors": errors,
    }
    return await render(request, "toolset_form.html", context, status=status)


def _rank(position: str) -> float:
    """A typed order as a number to sort by; none (or not a whole number) comes last."""
    try:
        return int(position)
    except ValueError:
        return float("inf")


async def _save(request: web.Request, toolset: dict[str, Any] | None) -> web.StreamResponse:
    servers = await _servers(request)
    rows = _rows_from_form(request, servers)
    values = {
        "name": field_text(request, "name"),
        "description": field_text(request, "description"),
    }
    members, order_errors = _members(rows)
    errors: dict[str, str] = {}
    row_errors = order_errors
    status = 422
    if not order_errors:
        body = {**values, "servers": members}
        try:
            if toolset is None:
                created = await call(
                    request, toolsets_api.create_toolset, body=validated(ToolsetIn, body)
                )
                return redirect(f"/toolsets/{created['id']}")
            await call(
                request,
                toolsets_api.update_toolset,
                toolset_id=toolset["id"],
                body=validated(ToolsetPatch, body),
            )
            return redirect(f"/toolsets/{toolset['id']}")
        except FormInvalid as exc:
            errors, row_errors = _row_errors(exc.errors, members)
        except ApiError as exc:
            if exc.status not in (400, 422):
                raise
            errors, row_errors = _row_errors(api_errors(exc), members)
            status = exc.status
    return await _form_page(request, toolset, values, rows, errors, row_errors, status)


@pages.get("/toolsets/new")
async def new_toolset_form(request: web.Request) -> web.StreamResponse:
    await authorize(request, toolsets_api.create_toolset)
    rows = _rows_from_toolset(None, await _servers(request))
    return await _form_page(request, None, {"name": "", "description": ""}, rows, {}, {})


@pages.post("/toolsets/new")
async def create_toolset(request: web.Request) -> web.StreamResponse:
    await authorize(request, toolsets_api.create_toolset)
    return await _save(request, None)


@pages.get("/toolsets/{toolset_id}/edit")
async def edit_toolset_form(request: web.Request) -> web.StreamResponse:
    await authorize(request, toolsets_api.update_toolset)
    toolset = await _toolset(request)
    rows = _rows_from_toolset(toolset, await _servers(request))
    return await _form_page(request, toolset, toolset, rows, {}, {})


@pages.post("/toolsets/{toolset_id}/edit")
async def edit_toolset(request: web.Request) -> web.StreamResponse:
    await authorize(request, toolsets_api.update_toolset)
    return await _save(request, await _toolset(request))


@pages.post("/toolsets/{toolset_id}/delete")
async def delete_toolset(request: web.Request) -> web.StreamResponse:
    toolset_id = path_id(request, "toolset_id", "toolset")
    await call(request, toolsets_api.delete_toolset, toolset_id=toolset_id)
    return redirect("/toolsets")


# -- one toolset ----------------------------------------------------------------------------------


@pages.get("/toolsets/{toolset_id}", "toolset.html")
async def toolset_page(request: web.Request) -> dict[str, Any]:
    toolset = await _toolset(request)
    servers = {str(server["id"]): server for server in await _servers(request)}
    exposed, problem = None, None
    try:
        exposed = await call(request, toolsets_api.list_toolset_tools, toolset_id=toolset["id"])
    except ApiError as exc:
        if exc.status != 429:  # a busy gateway: said on the page
            raise
        problem = exc.detail
    members = []
    for position, member in enumerate(toolset["servers"], start=1):
        server = servers.get(member["server_id"])
        if server is None:
            continue  # deleted since the toolset was read
        members.append(
            {
                **member,
                "position": position,
                "server": server,
                "shown_prefix": default_prefix(server["name"])
                if member["prefix"] is None
                else member["prefix"],
            }
        )
    return {
        "section": "toolsets",
        "toolset": toolset,
        "members": members,
        "servers": servers,
        "exposed": exposed,
        "problem": problem,
        "connect": connect_panel(toolset["name"], toolset["url"]),
    }


# -- helpers ------------------------------------------------------------------------------------


async def _toolset(request: web.Request) -> dict[str, Any]:
    toolset_id = path_id(request, "toolset_id", "toolset")
    toolset: dict[str, Any] = await call(request, toolsets_api.get_toolset, toolset_id=toolset_id)
    return toolset


async def _servers(request: web.Request) -> list[dict[str, Any]]:
    servers: list[dict[str, Any]] = await call(
        request, servers_api.list_servers, query=ServerQuery()
    )
    return servers
