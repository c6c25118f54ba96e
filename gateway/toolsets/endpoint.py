"""/api/v1/toolsets/{id}/mcp: a toolset as one MCP server, for clients of both protocol eras.

The gateway answers the protocol itself (`initialize`, `server/discover`, `ping`, `tools/list`)
and forwards each `tools/call` to the member that owns the tool, under the tool's own name,
through the proxy's exchange (gateway/proxy/handler.forward): the reply is relayed as it
arrives, JSON or SSE, and the call is logged against that server and tool with the toolset's
id. Key scopes, tool rules and rate limits apply to each call as in the proxy. A call that
became a task is followed as the proxy follows it (gateway/proxy/tasks), with the toolset's id;
requests about the task go to the member found holding it in pending_tasks.

Sessions (2025-03-26 .. 2025-11-25): `initialize` opens a session with every member the caller
may use, at once and concurrently, and seals them into the client's Mcp-Session-Id
(gateway/toolsets/sessions); DELETE ends them. A member that could not be reached then is
reached with a session of one request. 2026-07-28 clients need no session: a call to a member
that keeps sessions opens one for that request and ends it after.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Final

import orjson
from aiohttp import web
from multidict import CIMultiDict
from pydantic import Field

from gateway.accounts.access import MCP, PRINCIPAL, Access, Principal
from gateway.api.routing import Routes, read_bytes
from gateway.db import pending_tasks as pending_tasks_db
from gateway.errors import JsonRpcRefusal, NotFound, PayloadTooLarge
from gateway.keys import HTTP, POOL, SETTINGS
from gateway.mcp.client import (
    HANDSHAKE_PROTOCOL_VERSION,
    MODERN_PROTOCOL_VERSION,
)
from gateway.mcp.headers import header_text, param_header_map, param_headers
from gateway.policy import decisions
from gateway.proxy import cors
from gateway.proxy.governing import HEADER_MISMATCH, Filtering, govern, refusal
from gateway.proxy.handler import (
    PROXYING,
    JsonRpcErrorResponse,
    JsonRpcMessage,
    Proxying,
    Refusal,
    RuledOut,
    UpstreamReply,
    forward,
)
from gateway.proxy.headers import PASS_BACK
from gateway.proxy.requests import (
    UNNAMED_TOOL,
    ToolCallSeen,
    UnreadableRequest,
    tool_calls_in,
)
from gateway.toolsets.members import Members, forwarded, modern
from gateway.toolsets.names import Exposed
from gateway.toolsets.registry import TOOLSETS, Listing, Toolset, Toolsets
from gateway.toolsets.sessions import (
    MemberSession,
    Sealer,
    Session,
    caller,
    kept_capabilities,
)
from gateway.upstreams.servers import UPSTREAMS, Upstream
from gateway.upstreams.tool_lists import TOOL_LISTS

log = logging.getLogger(__name__)

routes = Routes("toolsets")

TOOLSET_PATH = "/toolsets/{toolset_id}/mcp"

# 404 is the toolset's {detail}, or a session's JSON-RPC error (the client then initialises).
NotKnown = Annotated[
    Refusal | JsonRpcErrorResponse,
    Field(description="no such toolset: {detail}; a session id it does not know: JSON-RPC -32001"),
]

# The 2025 revisions a session may speak; an initialize asking for another gets the latest.
_SESSION_VERSIONS: Final = frozenset({"2025-03-26", "2025-06-18", HANDSHAKE_PROTOCOL_VERSION})
_CAPABILITIES: Final = {"tools": {"listChanged": False}}
# JSON-RPC codes of the MCP transport (as the SDK servers answer them).
_INVALID_REQUEST: Final = -32600
_METHOD_NOT_FOUND: Final = -32601
_INVALID_PARAMS: Final = -32602
_PARSE_ERROR: Final = -32700
_NO_SESSION: Final = -32000
_SESSION_NOT_FOUND: Final = -32001
_UNSUPPORTED_VERSION: Final = -32022
# Requests about a task a call through the toolset became, routed to the member that holds it
# (tasks/list, 2025-11-25's, is not: see _answer), what a member answers a task it does not
# know (the tasks extension: -32602, its messages), and the requests whose Mcp-Name header
# carries the task id (2026-07-28).
_TASK_REQUESTS: Final = frozenset({"tasks/get", "tasks/result", "tasks/cancel", "tasks/update"})
_UNKNOWN_TASK: Final = {
    "tasks/get": "Failed to retrieve task: Task not found",
    "tasks/result": "Failed to retrieve task: Task not found",
    "tasks/cancel": "Failed to cancel task: Task not found",
    "tasks/update": "Failed to update task: Task not found",
}
_NAMED_BY_TASK: Final = frozenset({"tasks/get", "tasks/cancel", "tasks/update"})
# A member's reply keeps its own session id: the client's is the toolset's.
_PASS_BACK: Final = tuple(name for name in PASS_BACK if name.lower() != "mcp-session-id")


class ToolsetEndpoint:
    """What the endpoint uses: the toolsets, the session sealer, how to reach members."""

    def __init__(
        self, toolsets: Toolsets, sealer: Sealer, members: Members, server_version: str
    ) -> None:
        self.toolsets = toolsets
        self.sealer = sealer
        self.members = members
        self.server_version = server_version

    @classmethod
    async def setup(cls, app: web.Application, *, server_version: str) -> None:
        """on_startup, once the cleanup contexts have made the HTTP client."""
        settings = app[SETTINGS]
        members = Members(app[HTTP], app[UPSTREAMS], settings.proxy_timeout_seconds)
        sealer = Sealer(settings.secret_keys)
        app[TOOLSET_ENDPOINT] = cls(app[TOOLSETS], sealer, members, server_version)


TOOLSET_ENDPOINT: web.AppKey[ToolsetEndpoint] = web.AppKey("toolset_endpoint")


@routes.route(
    "POST",
    TOOLSET_PATH,
    summary="A toolset's MCP endpoint",
    access=MCP,
    request_body=JsonRpcMessage,
    response=UpstreamReply,
    errors=(400, 403, 404, 408, 413, 415, 429, 502, 503, 504),
    error_bodies={
        400: JsonRpcErrorResponse,
        403: RuledOut,
        404: NotKnown,
        429: RuledOut,
    },
    bodiless=(202,),
)
@routes.route(
    "DELETE",
    TOOLSET_PATH,
    summary="End a toolset session and its member sessions",
    access=MCP,
    errors=(400, 403, 404, 429),
    error_bodies={400: JsonRpcErrorResponse, 404: NotKnown},
)
async def toolset_mcp(request: web.Request, toolset_id: uuid.UUID) -> web.StreamResponse:
    """One MCP server over the toolset's members, for 2026-07-28 clients (`server/discover`,
    no session) and 2025-03-26 .. 2025-11-25 ones (`initialize`, `Mcp-Session-Id`).
    `tools/list` merges the members' tools under the toolset's names (docs/behaviour.md,
    "Toolsets"), leaving out a member that cannot be listed and the tools the caller may not
    call; `tools/call` goes to the owning member under the tool's own name, its reply relayed as
    it arrives (JSON, or SSE with progress), and is logged against that server and tool with
    `toolset_id`. Rules apply as in the proxy. A call that became a task (the tasks extension,
    or 2025-11-25's tasks) is logged once, when a reply ends the task: `tasks/get`,
    `tasks/update`, `tasks/cancel` and `tasks/result` go to the member that holds the task, and
    a task none of the members holds (or no longer: after its end) is JSON-RPC -32602;
    `tasks/list` is -32601. A session id that is forged, expired (after 24 hours), of another
    toolset or of another caller is 404: the client initialises again. There is no GET (no
    server-initiated stream: 405, which clients take as such); JSON-RPC batches are refused
    (-32600).

    Credentials as for the proxy: an API key, an access token, or an OAuth access token issued
    for this toolset's URL, acting as the member who consented (calls without
    `X-Caller-Agent` are logged with its client's name). When the gateway offers OAuth, a 401
    carries `WWW-Authenticate: Bearer resource_metadata="<PUBLIC_URL>/.well-known/
    oauth-protected-resource/api/v1/toolsets/{toolset_id}/mcp"` (RFC 9728), with
    `error="invalid_token"` when the credential sent was refused."""
    started = time.perf_counter()
    endpoint = request.app[TOOLSET_ENDPOINT]
    proxying = request.app[PROXYING]
    principal = request[PRINCIPAL]
    toolset = await endpoint.toolsets.get(toolset_id, principal.workspace_id)
    if toolset is None:
        raise NotFound("toolset not found")
    try:
        decisions.check_proxy(principal.rules)
    except decisions.Refused as refused:
        raise refusal(refused, []) from None
    with proxying.in_flight.holding(principal.workspace_id):
        if request.method == "DELETE":
            return await _end(request, endpoint, proxying, toolset, principal)
        message = await _message(request, proxying)
        return await _answer(request, endpoint, proxying, toolset, principal, message, started)


@routes.route(
    "OPTIONS",
    TOOLSET_PATH,
    summary="CORS preflight for browser MCP clients",
    access=Access(authenticated=False, api_key=True),
    status=204,
)
async def preflight(request: web.Request, toolset_id: uuid.UUID) -> web.Response:
    return cors.preflight(request)


async def _message(request: web.Request, proxying: Proxying) -> dict[str, Any]:
    """The request's one JSON-RPC message (400 with a JSON-RPC error otherwise)."""
    if (request.content_length or 0) > proxying.max_body_bytes:
        raise PayloadTooLarge(f"request body over {proxying.max_body_bytes} bytes")
    raw = await read_bytes(request)
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise JsonRpcRefusal(400, _PARSE_ERROR, "Parse error: the body is not JSON") from None
    if isinstance(message, list):
        raise JsonRpcRefusal(400, _INVALID_REQUEST, "a toolset takes one message, not a batch")
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        raise JsonRpcRefusal(400, _INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message")
    method = message.get("method")
    if method is not None and not isinstance(method, str):
        raise JsonRpcRefusal(400, _INVALID_REQUEST, "Invalid Request: method is not a string")
    params = message.get("params")
    if params is not None and not isinstance(params, dict):
        raise JsonRpcRefusal(400, _INVALID_REQUEST, "Invalid Request: params is not an object")
    return message


async def _answer(
    request: web.Request,
    endpoint: ToolsetEndpoint,
    proxying: Proxying,
    toolset: Toolset,
    principal: Principal,
    message: dict[str, Any],
    started: float,
) -> web.StreamResponse:
    method = message.get("method")
    rid = message.get("id")
    version = request.headers.get("MCP-Protocol-Version")
    modern = version == MODERN_PROTOCOL_VERSION
    if modern:
        _check_headers(request, message)
    elif version is not None and version not in _SESSION_VERSIONS and method != "initialize":
        raise JsonRpcRefusal(
            400, _UNSUPPORTED_VERSION, f"Unsupported protocol version: {version}", _rid(rid)
        )
    if method == "initialize" and not modern:
        return await _initialize(request, endpoint, toolset, principal, message)
    session = None if modern else _session(request, endpoint, toolset, principal, rid)
    if method is None or "id" not in message:
        # Notifications, and a client's answers to a server's requests (which a toolset does
        # not route: it makes no requests of its own).
        return web.Response(status=202, headers=_cors(request))
    if method == "ping":
        return _result(request, rid, {}, modern)
    if method == "server/discover" and modern:
        return _result(request, rid, _discover(endpoint, toolset), modern)
    if method == "tools/list":
        listing = await endpoint.toolsets.listing(toolset, request.app[TOOL_LISTS])
        tools = [_listed(tool) for tool in _visible(listing, principal)]
        result: dict[str, Any] = {"tools": tools}
        if modern:
            result |= {"cacheScope": "private", "ttlMs": 0}
        return _result(request, rid, result, modern)
    if method == "tools/call":
        return await _call(
            request, endpoint, proxying, toolset, principal, message, session, started
        )
    if method in _TASK_REQUESTS:
        return await _about_task(
            request, endpoint, proxying, toolset, principal, message, session, started
        )
    # tasks/list (2025-11-25) too: members answer it for the gateway's credentials, whoever
    # the caller, so a merged list would show one caller's tasks to another.
    return _error(request, rid, _METHOD_NOT_FOUND, f"Method not found: {method}")


def _check_headers(request: web.Request, message: dict[str, Any]) -> None:
    """2026-07-28: Mcp-Method, and Mcp-Name for a call, must say what the body says."""
    method = request.headers.get("Mcp-Method")
    if method is not None and method != message.get("method"):
        raise JsonRpcRefusal(
            400,
            HEADER_MISMATCH,
            "Header mismatch: the Mcp-Method header does not name the body's method",
            _rid(message.get("id")),
        )
    name = request.headers.get("Mcp-Name")
    if name is None:
        return
    params = message.get("params") or {}
    if message.get("method") == "tools/call" and header_text(name) != params.get("name"):
        raise JsonRpcRefusal(
            400,
            HEADER_MISMATCH,
            "Header mismatch: the Mcp-Name header does not name the tool the body calls",
            _rid(message.get("id")),
        )
    if message.get("method") in _NAMED_BY_TASK and header_text(name) != params.get("taskId"):
        raise JsonRpcRefusal(
            400,
            HEADER_MISMATCH,
            "Header mismatch: the Mcp-Name header does not name the task the body asks about",
            _rid(message.get("id")),
        )


def _session(
    request: web.Request,
    endpoint: ToolsetEndpoint,
    toolset: Toolset,
    principal: Principal,
    rid: Any,
) -> Session:
    """The client's session: 400 without one, 404 for one that is not (or no longer) valid."""
    session_id = request.headers.get("Mcp-Session-Id")
    if session_id is None:
        raise JsonRpcRefusal(
            400, _NO_SESSION, "Bad Request: No valid session ID provided", _rid(rid)
        )
    session = endpoint.sealer.open(session_id)
    if session is None or session.toolset_id != toolset.id or session.caller != caller(principal):
        raise JsonRpcRefusal(404, _SESSION_NOT_FOUND, "Session not found", _rid(rid))
    return session


async def _initialize(
    request: web.Request,
    endpoint: ToolsetEndpoint,
    toolset: Toolset,
    principal: Principal,
    message: dict[str, Any],
) -> web.StreamResponse:
    """A new session: one with every member the caller may use, opened concurrently."""
    params = message.get("params") or {}
    asked = params.get("protocolVersion")
    version = asked if asked in _SESSION_VERSIONS else HANDSHAKE_PROTOCOL_VERSION
    upstreams = [
        upstream
        for upstream in await endpoint.members.of(toolset)
        if _may_use(principal, upstream.id)
    ]
    opened = await asyncio.gather(*(endpoint.members.open(upstream) for upstream in upstreams))
    info = params.get("clientInfo")
    session = Session(
        toolset_id=toolset.id,
        caller=caller(principal),
        protocol_version=version,
        client_capabilities=kept_capabilities(params.get("capabilities")),
        client_info=info if isinstance(info, dict) and len(orjson.dumps(info)) <= 512 else {},
        members=tuple(member for member in opened if member is not None),
    )
    result = {
        "protocolVersion": version,
        "capabilities": _CAPABILITIES,
        "serverInfo": {"name": toolset.name, "version": endpoint.server_version},
    }
    response = _result(request, message.get("id"), result, modern=False)
    response.headers["Mcp-Session-Id"] = endpoint.sealer.seal(session)
    return response


async def _end(
    request: web.Request,
    endpoint: ToolsetEndpoint,
    proxying: Proxying,
    toolset: Toolset,
    principal: Principal,
) -> web.Response:
    """DELETE: the member sessions end with the client's."""
    session = _session(request, endpoint, toolset, principal, None)
    await endpoint.members.end(await endpoint.members.of(toolset), session)
    return web.Response(status=200, headers=_cors(request))


def _may_use(principal: Principal, server_id: uuid.UUID) -> bool:
    try:
        decisions.check_server(principal.rules, server_id)
    except decisions.Refused:
        return False
    return True


def _visible(listing: Listing, principal: Principal) -> list[Exposed]:
    """The tools this caller may call: of the members its key may use, within its allowed
    tools and outside each server's disabled ones (each member's rules looked at once)."""
    filters = {
        server_id: decisions.tool_filter(principal.rules, upstream.rules)
        for server_id, upstream in listing.upstreams.items()
        if _may_use(principal, server_id)
    }
    return [
        tool
        for tool in listing.merged.tools
        if tool.server_id in filters
        and ((allowed := filters[tool.server_id]) is None or allowed(tool.tool_name))
    ]


def _listed(tool: Exposed) -> dict[str, Any]:
    return {**tool.tool, "name": tool.name}


def _discover(endpoint: ToolsetEndpoint, toolset: Toolset) -> dict[str, Any]:
    return {
        "supportedVersions": [MODERN_PROTOCOL_VERSION],
        "capabilities": _CAPABILITIES,
        "cacheScope": "private",
        "ttlMs": 0,
        "_meta": {
            "io.modelcontextprotocol/serverInfo": {
                "name": toolset.name,
                "version": endpoint.server_version,
            }
        },
    }


async def _call(
    request: web.Request,
    endpoint: ToolsetEndpoint,
    proxying: Proxying,
    toolset: Toolset,
    principal: Principal,
    message: dict[str, Any],
    session: Session | None,
    started: float,
) -> web.StreamResponse:
    """A tools/call, forwarded to the member that owns the tool under the tool's own name."""
    rid = message.get("id")
    params = dict(message.get("params") or {})
    name = params.get("name")
    if not isinstance(name, str):
        return _error(request, rid, _INVALID_PARAMS, "Invalid params: the tool name is missing")
    tool, listing = await endpoint.toolsets.find(toolset, name, request.app[TOOL_LISTS])
    if tool is None:
        return _error(request, rid, _INVALID_PARAMS, f"Unknown tool: {name}")
    # A tool the caller may not call is refused (and logged) by the rules below, as in the
    # proxy, though its tools/list does not show it.
    upstream = listing.upstreams[tool.server_id]
    async with endpoint.members.reached(upstream, session) as member:
        params["name"] = tool.tool_name
        body, headers = forwarded(
            request, message, params, tool.tool_name, member, upstream, session
        )
        arguments = params.get("arguments")
        if session is not None and modern(member) and isinstance(arguments, Mapping):
            # A 2026-07-28 client sends these itself; a 2025-era one's session speaks for it.
            mirrored = param_header_map(tool.tool.get("inputSchema"))
            headers.update(param_headers(mirrored, arguments))
        seen = ToolCallSeen(tool.tool_name, rid)
        # 2025-11-25's tasks: a call that asks for one may be answered `{"task": ...}`.
        seen.tasked = "task" in params
        calls = [seen]
        filtering = None
        if principal.rules is not None or upstream.rules is not None:
            filtering = await govern(
                request,
                proxying.budgets,
                proxying.call_log,
                principal.rules,
                upstream,
                body,
                calls,
                started,
                toolset_id=toolset.id,
            )
        return await _send(
            request, endpoint, proxying, toolset, upstream, member, headers, body, calls,
            started, filtering,
        )  # fmt: skip


async def _about_task(
    request: web.Request,
    endpoint: ToolsetEndpoint,
    proxying: Proxying,
    toolset: Toolset,
    principal: Principal,
    message: dict[str, Any],
    session: Session | None,
    started: float,
) -> web.StreamResponse:
    """A request about a task (tasks/get, tasks/result, tasks/cancel, tasks/update), forwarded
    to the member that holds the task: the one the gateway follows it for (pending_tasks, one
    round trip), as the proxy would forward it (a reply that ends the task logs its call).
    Only the key's permission and servers apply: it calls no tool."""
    rid = message.get("id")
    method = message["method"]
    params = dict(message.get("params") or {})
    task_id = params.get("taskId")
    if not isinstance(task_id, str):
        return _error(request, rid, _INVALID_PARAMS, "Invalid params: the task id is missing")
    upstreams = await endpoint.members.of(toolset)
    held_by = await pending_tasks_db.holder(
        request.app[POOL], task_id, [upstream.id for upstream in upstreams], toolset.id
    )
    upstream = next((u for u in upstreams if u.id == held_by), None)
    if upstream is None:
        # As a server answers a task it does not know (the tasks extension: -32602).
        return _error(request, rid, _INVALID_PARAMS, _UNKNOWN_TASK[method])
    try:
        decisions.check_server(principal.rules, upstream.id)
    except decisions.Refused as refused:
        # As a call to that member is refused: to the request's id (it logs no row).
        raise refusal(refused, [ToolCallSeen(UNNAMED_TOOL, rid)], to_calls=True) from None
    async with endpoint.members.reached(upstream, session) as member:
        name = task_id if method in _NAMED_BY_TASK else None
        body, headers = forwarded(request, message, params, name, member, upstream, session)
        try:
            calls = tool_calls_in(body)  # the proxy's reading: tasks/update ends nothing
        except UnreadableRequest as exc:
            raise JsonRpcRefusal(400, exc.code, exc.message, _rid(rid)) from None
        return await _send(
            request, endpoint, proxying, toolset, upstream, member, headers, body, calls,
            started, None,
        )  # fmt: skip


async def _send(
    request: web.Request,
    endpoint: ToolsetEndpoint,
    proxying: Proxying,
    toolset: Toolset,
    upstream: Upstream,
    member: MemberSession,
    headers: CIMultiDict[str],
    body: bytes,
    calls: list[ToolCallSeen],
    started: float,
    filtering: Filtering | None,
) -> web.StreamResponse:
    """The request, as the member takes it, through the proxy's exchange: the reply relayed,
    its calls logged with the toolset's id, and what the member's answer says of it learnt."""
    response = await forward(
        request,
        proxying,
        upstream,
        headers,
        body,
        calls,
        started,
        filtering,
        toolset_id=toolset.id,
        pass_back=_PASS_BACK,
    )
    endpoint.members.answered(upstream, member, response)
    return response


def _result(request: web.Request, rid: Any, result: dict[str, Any], modern: bool) -> web.Response:
    if modern:
        result = {**result, "resultType": "complete"}
    return web.Response(
        body=orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result}),
        content_type="application/json",
        headers=_cors(request),
    )


def _error(request: web.Request, rid: Any, code: int, message: str) -> web.Response:
    return web.Response(
        body=orjson.dumps(
            {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}
        ),
        content_type="application/json",
        headers=_cors(request),
    )


def _cors(request: web.Request) -> dict[str, str] | None:
    return cors.ANSWER_HEADERS if "Origin" in request.headers else None


def _rid(rid: Any) -> str | int | None:
    return rid if isinstance(rid, str | int) and not isinstance(rid, bool) else None
