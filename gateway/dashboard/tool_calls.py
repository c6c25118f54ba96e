"""The tool-call log: every filter of GET /tool-calls, pages of 50, one call's details."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from gateway.api import servers as servers_api
from gateway.api import tool_calls as tool_calls_api
from gateway.api.servers import ServerQuery
from gateway.api.tool_calls import ToolCallQuery
from gateway.dashboard.pages import PAGE_SIZE, FormInvalid, Pages, call, pager, path_id, validated
from gateway.dashboard.sessions import SESSION
from gateway.db import tool_calls as tool_calls_db
from gateway.db import toolsets as toolsets_db
from gateway.errors import NotFound
from gateway.keys import POOL, SETTINGS

pages = Pages()

_FILTERS = (
    "server_id",
    "toolset_id",
    "tool_name",
    "caller_agent",
    "status",
    "refused",
    "start",
    "end",
)


async def toolset_choices(request: web.Request, chosen: str | None) -> list[tuple[str, str]]:
    """The options of a toolset filter, (id, name) by name: the workspace's toolsets, and the
    chosen id if it is none of them (a toolset deleted since: its calls keep its id)."""
    workspace_id = request[SESSION].workspace_id
    assert workspace_id is not None
    toolsets = await toolsets_db.names(request.app[POOL], workspace_id)
    choices = [(str(id_), name) for id_, name in toolsets]
    try:
        unknown = chosen is not None and uuid.UUID(chosen) not in dict(toolsets)
    except ValueError:  # the filter's own error says what is wrong with it
        unknown = False
    if unknown:
        choices.append((str(chosen), "unknown toolset (deleted)"))
    return choices


@pages.get("/tool-calls", "tool_calls.html")
async def tool_call_log(request: web.Request) -> dict[str, Any]:
    filters = {k: v for k in _FILTERS if (v := request.query.get(k, "").strip())}
    offset = request.query.get("offset", "0")
    servers = await call(request, servers_api.list_servers, query=ServerQuery())
    toolsets = await toolset_choices(request, filters.get("toolset_id"))
    context: dict[str, Any] = {
        "section": "tool-calls",
        "filters": filters,
        "servers": servers,
        "toolsets": toolsets,
        "toolset_names": dict(toolsets),
        "calls": [],
        "page": None,
        "errors": {},
        # A call's trace links here (GATEWAY_TRACE_URL), or shows its id without one.
        "trace_url": request.app[SETTINGS].trace_url,
    }
    try:
        query = validated(ToolCallQuery, {**filters, "limit": PAGE_SIZE, "offset": offset})
    except FormInvalid as exc:
        context["errors"] = exc.errors
        return context
    found = await call(request, tool_calls_api.list_tool_calls, query=query)
    context["calls"] = found["items"]
    context["page"] = pager(
        "/tool-calls", filters, query.offset, len(found["items"]), found["total"]
    )
    return context


@pages.get("/tool-calls/{call_id}", "tool_call.html")
async def tool_call(request: web.Request) -> dict[str, Any]:
    call_id = path_id(request, "call_id", "tool call")
    workspace_id = request[SESSION].workspace_id
    assert workspace_id is not None
    found = await tool_calls_db.get_tool_call(request.app[POOL], workspace_id, call_id)
    if found is None:
        raise NotFound("tool call not found")
    toolset = None
    if found["toolset_id"] is not None:
        names = dict(await toolsets_db.names(request.app[POOL], workspace_id))
        toolset = names.get(found["toolset_id"], "unknown toolset (deleted)")
    return {
        "section": "tool-calls",
        "call": found,
        "toolset": toolset,
        "trace_url": request.app[SETTINGS].trace_url,
    }
