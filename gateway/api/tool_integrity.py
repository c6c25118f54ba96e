"""/servers/{id}/tools/changes and /servers/{id}/tools/approve: tool integrity, the history of
a server's tool definitions and the approvals a server that pins its tools serves."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import ConfigDict, Field, StringConstraints

from gateway.accounts.access import ADMIN, PRINCIPAL, READ
from gateway.api.models import Body, Out, Page
from gateway.api.routing import Routes
from gateway.db import server_tools as server_tools_db
from gateway.db import servers as servers_db
from gateway.errors import NotFound, ValidationFailed
from gateway.keys import POOL
from gateway.mcp.tool_list_budget import MAX_TOOLS
from gateway.upstreams.servers import UPSTREAMS

routes = Routes("tool integrity")

ToolName = Annotated[str, StringConstraints(min_length=1, max_length=255)]


class ToolChangeOut(Out):
    id: uuid.UUID
    server_id: uuid.UUID
    tool_name: str
    change: Literal["added", "removed", "changed"]
    before: dict[str, Any] | None = Field(
        description="the definition before (name, title, description, inputSchema, "
        "outputSchema, annotations as listed); null for an added tool"
    )
    after: dict[str, Any] | None = Field(description="the definition after; null when removed")
    detected_at: datetime


class ToolChangePage(Out):
    items: list[ToolChangeOut]
    total: int


class ApproveIn(Body):
    # Unknown fields are refused, not ignored: `{}` approves every tool, and a misspelt
    # `tools` must not.
    model_config = ConfigDict(strict=True, extra="forbid")

    tools: Annotated[list[ToolName], Field(min_length=1, max_length=MAX_TOOLS)] | None = Field(
        default=None,
        description="the tools to approve, by name, each among those the server lists now; "
        "left out: every tool",
    )


class ApprovalOut(Out):
    approved: list[str] = Field(description="the tools this request approved")
    waiting: list[str] = Field(
        description="the server's tools whose current definition is still not approved"
    )


@routes.get(
    "/servers/{server_id}/tools/changes",
    summary="How a server's tools changed, newest first",
    access=READ,
    response=ToolChangePage,
)
async def list_changes(request: web.Request, server_id: uuid.UUID, query: Page) -> dict[str, Any]:
    """Every tool list the gateway sees (probes, playground fetches, proxied `tools/list`
    replies) is compared with the last one: a tool added, removed, or whose definition (name,
    title, description, inputSchema, outputSchema, annotations) changed is one item, with the
    definitions before and after. The first list seen is where the history starts; the same
    list seen again is no change. At most 1,000 changes per server are kept."""
    pool = request.app[POOL]
    if await servers_db.get(pool, request[PRINCIPAL].workspace_id, server_id) is None:
        raise NotFound("server not found")
    items = await server_tools_db.list_changes(pool, server_id, query.limit, query.offset)
    return {"items": items, "total": await server_tools_db.count_changes(pool, server_id)}


@routes.post(
    "/servers/{server_id}/tools/approve",
    summary="Approve a server's current tool definitions",
    access=ADMIN,
    response=ApprovalOut,
)
async def approve_tools(
    request: web.Request, server_id: uuid.UUID, body: ApproveIn
) -> dict[str, Any]:
    """Approves the definitions last seen of the named tools (`{"tools": [...]}`), or of all
    of them (`{}`), for a server that pins its tools (`pin_tools`): those tools may be called
    again, and show in `tools/list`, until their definition changes. A name the server does not
    list now is 422, and nothing is approved."""
    workspace_id = request[PRINCIPAL].workspace_id
    async with request.app[POOL].acquire() as conn, conn.transaction():
        server = await servers_db.lock(conn, workspace_id, server_id)
        if server is None:
            raise NotFound("server not found")
        current = {tool["name"]: tool for tool in await server_tools_db.tools(conn, server_id)}
        if body.tools is not None:
            unknown = [name for name in dict.fromkeys(body.tools) if name not in current]
            if unknown:
                raise ValidationFailed(
                    f"body.tools: not among the tools the server lists now: "
                    f"{', '.join(repr(name) for name in unknown[:10])}"
                )
        names = None if body.tools is None else list(dict.fromkeys(body.tools))
        approved = await server_tools_db.approve(conn, server_id, names, notify=server.pin_tools)
        remaining = await server_tools_db.tools(conn, server_id)
    request.app[UPSTREAMS].forget(server_id)
    return {
        "approved": approved,
        "waiting": [tool["name"] for tool in remaining if not tool["approved"]],
    }
