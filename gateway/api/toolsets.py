"""/toolsets: one MCP endpoint over several servers of a workspace, and the tools it exposes."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, Any

from aiohttp import web
from pydantic import AfterValidator, Field, StringConstraints

from gateway.accounts.access import ADMIN, PRINCIPAL, READ
from gateway.api.models import Body, Documented, Name, Out, ToolPatterns
from gateway.api.routing import API_PREFIX, Routes
from gateway.api.servers import Description
from gateway.db import toolsets as toolsets_db
from gateway.db.bounds import AtBound
from gateway.errors import BoundReached, NotFound, ValidationFailed
from gateway.keys import POOL, SETTINGS
from gateway.proxy.handler import PROXYING
from gateway.toolsets.endpoint import TOOLSET_PATH
from gateway.toolsets.registry import TOOLSETS
from gateway.upstreams.tool_lists import TOOL_LISTS

routes = Routes("toolsets")

MAX_MEMBERS = 50
MAX_PREFIX = 40
_PREFIX = re.compile(r"[A-Za-z0-9_-]*")

_TOOLS = (
    "null: every tool of the server; else only the tools these name globs match (* is any "
    "characters, ? is one). Tools the server disables (its disabled_tools) are never exposed"
)
_MEMBER_PREFIX = (
    "put before each of the server's tool names: null is the default, the server's name in "
    "lower case with every run of characters outside [a-z0-9_] made one `_`, then `__` "
    '("GitHub Tools" gives `github_tools__`, and it follows a rename); "" is no prefix'
)
_SERVERS = (
    f"the member servers in order, at most {MAX_MEMBERS}, each once: when two expose the same "
    "tool name, the first one's tool is kept (GET /toolsets/{id}/tools lists the conflicts)"
)


def _prefix(value: str) -> str:
    if not _PREFIX.fullmatch(value):
        raise ValueError("may hold only letters, digits, _ and - (names clients accept)")
    return value


Prefix = Annotated[
    str,
    StringConstraints(max_length=MAX_PREFIX),
    AfterValidator(_prefix),
    Documented(rf"^[A-Za-z0-9_-]{{0,{MAX_PREFIX}}}$"),
]


class ToolsetMemberIn(Body):
    server_id: uuid.UUID = Field(description="a server of this workspace")
    tools: ToolPatterns | None = Field(default=None, description=_TOOLS)
    prefix: Prefix | None = Field(default=None, description=_MEMBER_PREFIX)


Members = Annotated[list[ToolsetMemberIn], Field(max_length=MAX_MEMBERS, description=_SERVERS)]


class ToolsetIn(Body):
    name: Name
    description: Description = ""
    servers: Members = Field(default_factory=list)


class ToolsetPatch(Body):
    """Only supplied fields change; `servers` replaces the whole member list."""

    name: Name | None = None
    description: Description | None = None
    servers: Members | None = None


class ToolsetMemberOut(Out):
    server_id: uuid.UUID
    tools: list[str] | None = Field(description=_TOOLS)
    prefix: str | None = Field(description=_MEMBER_PREFIX)


class ToolsetOut(Out):
    id: uuid.UUID
    name: str
    description: str
    servers: list[ToolsetMemberOut] = Field(description=_SERVERS)
    url: str = Field(
        description="the toolset's MCP endpoint for agents, with an API key as "
        "`Authorization: Bearer mcpg_…` or `X-API-Key`. Absolute: it starts with the "
        "PUBLIC_URL setting, as a server's proxy_url does"
    )
    created_at: datetime
    updated_at: datetime


class ExposedToolOut(Out):
    name: str = Field(description="the name clients see: the member's prefix and the tool's name")
    server_id: uuid.UUID = Field(description="the member whose tool it is")
    tool_name: str = Field(description="the tool's own name on that server")
    description: str = Field(description="empty when the server gives none")
    input_schema: dict[str, Any] = Field(
        alias="inputSchema", description="JSON Schema of the arguments, as the server declares it"
    )


class ToolConflictOut(Out):
    """A tool left out: an earlier member's tool has the same exposed name."""

    name: str
    server_id: uuid.UUID
    tool_name: str
    kept_server_id: uuid.UUID
    kept_tool_name: str


class UnavailableMemberOut(Out):
    server_id: uuid.UUID
    detail: str = Field(description="why its tools could not be listed (as the playground says)")


class ToolsetToolsOut(Out):
    tools: list[ExposedToolOut] = Field(description="in the members' order, then each server's")
    conflicts: list[ToolConflictOut]
    unavailable: list[UnavailableMemberOut] = Field(
        description="members whose tools could not be listed now: theirs are left out"
    )


def toolset_url(base_url: str, toolset_id: object) -> str:
    """The absolute URL agents use for a toolset: base_url is Settings.base_url (PUBLIC_URL)."""
    return f"{base_url}{API_PREFIX}{TOOLSET_PATH.format(toolset_id=toolset_id)}"


def _out(request: web.Request, toolset: dict[str, Any]) -> dict[str, Any]:
    """A toolset as the API shows it: the stored row and its MCP URL."""
    toolset["url"] = toolset_url(request.app[SETTINGS].base_url, toolset["id"])
    return toolset


def _members(servers: list[ToolsetMemberIn]) -> list[dict[str, Any]]:
    """The members as stored, in order; a server listed twice is a 422 naming where."""
    first: dict[uuid.UUID, int] = {}
    twice = []
    for index, member in enumerate(servers):
        earlier = first.setdefault(member.server_id, index)
        if earlier != index:
            twice.append(
                f"body.servers.{index}.server_id: the same server as body.servers.{earlier}; "
                "a server is a member once"
            )
    if twice:
        raise ValidationFailed("; ".join(twice))
    return [{"server_id": m.server_id, "tools": m.tools, "prefix": m.prefix} for m in servers]


def _unknown(exc: toolsets_db.UnknownServers, members: list[dict[str, Any]]) -> ValidationFailed:
    # The same words whether the id is another workspace's or nobody's: nothing is revealed.
    unknown = set(exc.ids)
    return ValidationFailed(
        "; ".join(
            f"body.servers.{index}.server_id: not a server of this workspace"
            for index, member in enumerate(members)
            if member["server_id"] in unknown
        )
    )


@routes.get("/toolsets", summary="Toolsets", access=READ, response=list[ToolsetOut])
async def list_toolsets(request: web.Request) -> list[dict[str, Any]]:
    """Every toolset of the workspace, ordered by name, each with its members in order."""
    toolsets = await toolsets_db.list_toolsets(request.app[POOL], request[PRINCIPAL].workspace_id)
    return [_out(request, toolset) for toolset in toolsets]


@routes.post(
    "/toolsets",
    summary="Create a toolset",
    access=ADMIN,
    status=201,
    response=ToolsetOut,
    errors=(400,),
)
async def create_toolset(request: web.Request, body: ToolsetIn) -> dict[str, Any]:
    """Its `url` is the MCP endpoint agents connect to. Every member must be a server of this
    workspace, listed once (else 422 naming `body.servers.<n>.server_id`). A name already
    taken in the workspace is 400. A workspace holds at most
    GATEWAY_MAX_TOOLSETS_PER_WORKSPACE toolsets (default 100): past that, 422."""
    members = _members(body.servers)
    limit = request.app[SETTINGS].max_toolsets_per_workspace
    async with request.app[POOL].acquire() as conn:
        try:
            created = await toolsets_db.create(
                conn,
                request[PRINCIPAL].workspace_id,
                name=body.name,
                description=body.description,
                members=members,
                limit=limit,
            )
        except AtBound:
            raise BoundReached(
                f"this workspace has {limit} toolsets",
                "GATEWAY_MAX_TOOLSETS_PER_WORKSPACE",
                "delete one first",
            ) from None
        except toolsets_db.UnknownServers as exc:
            raise _unknown(exc, members) from None
    return _out(request, created)


@routes.get("/toolsets/{toolset_id}", summary="One toolset", access=READ, response=ToolsetOut)
async def get_toolset(request: web.Request, toolset_id: uuid.UUID) -> dict[str, Any]:
    toolset = await toolsets_db.get(request.app[POOL], request[PRINCIPAL].workspace_id, toolset_id)
    if toolset is None:
        raise NotFound("toolset not found")
    return _out(request, toolset)


@routes.patch(
    "/toolsets/{toolset_id}",
    summary="Change a toolset",
    access=ADMIN,
    response=ToolsetOut,
    errors=(400,),
)
async def update_toolset(
    request: web.Request, toolset_id: uuid.UUID, body: ToolsetPatch
) -> dict[str, Any]:
    """Only supplied fields change. `servers` replaces the whole member list, in its order
    (`[]` leaves none), under the same rules as at creation."""
    members = None if body.servers is None else _members(body.servers)
    changes = toolsets_db.ToolsetChanges(
        name=body.name, description=body.description, members=members
    )
    async with request.app[POOL].acquire() as conn:
        try:
            toolset = await toolsets_db.update(
                conn, request[PRINCIPAL].workspace_id, toolset_id, changes
            )
        except toolsets_db.UnknownServers as exc:
            assert members is not None  # only members name servers
            raise _unknown(exc, members) from None
    if toolset is None:
        raise NotFound("toolset not found")
    # This process at once; the others when they hear the NOTIFY.
    request.app[TOOLSETS].forget(toolset_id)
    return _out(request, toolset)


@routes.delete("/toolsets/{toolset_id}", summary="Delete a toolset", access=ADMIN)
async def delete_toolset(request: web.Request, toolset_id: uuid.UUID) -> None:
    """Its member servers stay as they are; its MCP endpoint answers 404 from then on."""
    if not await toolsets_db.delete(request.app[POOL], request[PRINCIPAL].workspace_id, toolset_id):
        raise NotFound("toolset not found")
    request.app[TOOLSETS].forget(toolset_id)


# -- the tools it exposes -------------------------------------------------------------------------


@routes.get(
    "/toolsets/{toolset_id}/tools",
    summary="The tools the toolset exposes",
    access=READ,
    response=ToolsetToolsOut,
    errors=(429,),
)
async def list_toolset_tools(request: web.Request, toolset_id: uuid.UUID) -> dict[str, Any]:
    """What the toolset's MCP endpoint lists: each member's tools (those its `tools` globs
    match, never those the server disables), under names of their own. A name is the member's
    prefix and the tool's name, every character outside [A-Za-z0-9_-] made `_`; a name over
    64 characters keeps its first 55 and ends in `_` and 8 hex digits of its SHA-256. When two
    tools get the same name, the first member's is kept and the other is in `conflicts`.
    Each member's list is the playground's (cached for GATEWAY_TOOLS_CACHE_SECONDS), fetched
    for every member at once; a member that cannot be listed (unreachable, failing, too slow,
    a list over the bounds) is in `unavailable` with the reason, and the others are listed."""
    workspace_id = request[PRINCIPAL].workspace_id
    toolsets = request.app[TOOLSETS]
    toolset = await toolsets.get(toolset_id, workspace_id)
    if toolset is None:
        raise NotFound("toolset not found")
    # It holds upstream connections as a proxied request does: counted with them.
    with request.app[PROXYING].in_flight.holding(workspace_id):
        listing = await toolsets.listing(toolset, request.app[TOOL_LISTS])
    return {
        "tools": [
            {
                "name": exposed.name,
                "server_id": exposed.server_id,
                "tool_name": exposed.tool_name,
                "description": exposed.tool["description"],
                "inputSchema": exposed.tool["inputSchema"],
            }
            for exposed in listing.merged.tools
        ],
        "conflicts": listing.merged.conflicts,
        "unavailable": listing.unavailable,
    }
