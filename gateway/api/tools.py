"""/servers/{id}/tools: the tool playground (list a server's tools, call one, drop the cache)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import orjson
from aiohttp import web
from pydantic import Field, StringConstraints

from gateway.accounts.access import ADMIN, PRINCIPAL, READ
from gateway.api.models import Body, Out
from gateway.api.routing import Routes
from gateway.calllog.records import ToolCall, clean_text, new_call_id
from gateway.calllog.writer import CALL_LOG, Reservation, no_room
from gateway.errors import (
    BadGateway,
    Forbidden,
    GatewayTimeout,
    NotFound,
    TooManyRequests,
    ValidationFailed,
)
from gateway.keys import HTTP, SETTINGS
from gateway.mcp.errors import McpError, error_kind
from gateway.ops.tracing import (
    METHOD,
    OPERATION,
    SERVER,
    TOOL,
    TRACE,
    TRACING,
    Trace,
    error_type,
    peer,
    set_failed,
)
from gateway.policy import decisions
from gateway.policy.budgets import BUDGETS
from gateway.proxy.handler import PROXYING
from gateway.proxy.replies import failed_result_text, shorten
from gateway.proxy.requests import UNNAMED_TOOL
from gateway.security.untrusted_schemas import SCHEMA_CHECKER, Problem, Verdict
from gateway.upstreams.servers import UPSTREAMS, Upstream
from gateway.upstreams.tool_lists import TOOL_LIST_MEMORY, TOOL_LISTS, mcp_session

log = logging.getLogger(__name__)

routes = Routes("tool playground")

PLAYGROUND_AGENT = "mcp-gateway-playground"


class ToolOut(Out):
    name: str
    description: str = Field(description="empty when the server gives none")
    input_schema: dict[str, Any] = Field(
        alias="inputSchema", description="JSON Schema of the arguments, as the server declares it"
    )
    disabled: bool = Field(
        description="it matches the server's disabled_tools: nobody may call it through the "
        "gateway (the playground's invoke is 403)"
    )


class ToolListOut(Out):
    server_id: uuid.UUID
    tools: list[ToolOut]
    cached: bool = Field(description="true: from the cache; false: fetched for this request")
    cached_at: datetime = Field(description="when this list was fetched from the server")


class InvokeIn(Body):
    tool_name: Annotated[str, StringConstraints(min_length=1, max_length=255)]
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="checked against the tool's inputSchema first"
    )


class InvokeOut(Out):
    tool_call_id: uuid.UUID = Field(description="the logged tool call (see GET /tool-calls)")
    result: Any = Field(
        description="the MCP tool result (content, structuredContent, isError) as the server "
        "sent it; null when there is none because the call failed"
    )
    duration_ms: int = Field(description="connecting to the server and calling the tool")
    status: Literal["success", "error"]
    error_message: str | None = Field(
        description="why the call failed: the upstream failure, or the text the tool returned "
        "with isError"
    )
    arguments_checked: bool = Field(
        description="true: the arguments were checked against the tool's inputSchema (and met "
        "it) before the call; false: they were sent unchecked, `arguments_unchecked_reason` "
        "says why"
    )
    arguments_unchecked_reason: str | None = Field(
        description="null when the arguments were checked; else why not: the inputSchema "
        "cannot be used (not a valid JSON Schema, a `$ref` to another document, over 1 MiB or "
        "nested deeper than 64 levels), its check did not start or finish within "
        "GATEWAY_SCHEMA_CHECK_SECONDS, or the tool list could not be read"
    )


@dataclass(frozen=True, slots=True)
class _Outcome:
    result: dict[str, Any] | None
    error: str | None
    duration_ms: int
    # What kind of failure the exchange was (a span's error.type); "" when the error, if
    # any, says it.
    kind: str = ""


async def _upstream(request: web.Request, server_id: uuid.UUID) -> Upstream:
    upstream = await request.app[UPSTREAMS].get(server_id, request[PRINCIPAL].workspace_id)
    if upstream is None:
        raise NotFound("server not found")
    return upstream


@routes.get(
    "/servers/{server_id}/tools",
    summary="The server's tools",
    access=READ,
    response=ToolListOut,
    errors=(429, 502, 504),
)
async def list_tools(request: web.Request, server_id: uuid.UUID) -> dict[str, Any]:
    """Listed from the server through the gateway's MCP client with its stored credentials,
    then cached for GATEWAY_TOOLS_CACHE_SECONDS (shared by every gateway process with
    REDIS_URL). Concurrent requests while nothing is cached share one fetch. A server that
    cannot be reached or answers with an error is 502, one that does not answer within
    GATEWAY_PROXY_TIMEOUT_SECONDS 504, as with the proxy. A tool list over 8 MiB (over all its
    pages), with more than 2,000 tools, or that would take over 96 MiB of memory once parsed
    is not read to the end: 502, the detail saying which bound it broke."""
    upstream = await _upstream(request, server_id)
    with request.app[PROXYING].in_flight.holding(upstream.workspace_id):
        listing = await request.app[TOOL_LISTS].get(upstream)
    disabled = None if upstream.rules is None else upstream.rules.disabled
    return {
        "server_id": upstream.id,
        "tools": [
            {
                "name": tool["name"],
                "description": tool["description"],
                "inputSchema": tool["inputSchema"],
                "disabled": disabled is not None and disabled.match(tool["name"]),
            }
            for tool in listing.tools
        ],
        "cached": listing.cached,
        "cached_at": listing.fetched_at,
    }


@routes.delete(
    "/servers/{server_id}/tools/cache", summary="Drop the cached tool list", access=ADMIN
)
async def drop_tools_cache(request: web.Request, server_id: uuid.UUID) -> None:
    """The next GET of the server's tools fetches them again, in every gateway process."""
    upstream = await _upstream(request, server_id)
    await request.app[TOOL_LISTS].drop(upstream.id)


INVOKE_PATH = "/servers/{server_id}/tools/invoke"


@routes.post(
    INVOKE_PATH,
    summary="Call one of the server's tools",
    access=ADMIN,
    response=InvokeOut,
    errors=(403, 429),
)
async def invoke_tool(request: web.Request, server_id: uuid.UUID, body: InvokeIn) -> dict[str, Any]:
    """The tool must be in the server's tool list (cached or fetched now), else 422 naming
    `body.tool_name`; the arguments are checked against its inputSchema, else 422 naming each
    bad argument (`body.arguments.<path>: <problem>`, most relevant first, at most 10).
    Nothing is called or logged then. The check runs in a separate process within
    GATEWAY_SCHEMA_CHECK_SECONDS; a schema that cannot be checked (unusable, too large, too
    slow to check) is not enforced: the call goes on, and `arguments_checked` is false with
    the reason. A tool matching the server's `disabled_tools` is 403, and a call over the
    server's `rate_limit` 429 with Retry-After, each logged as a refused tool call. Otherwise
    the call is logged as a tool call (caller_agent `mcp-gateway-playground`) before the
    answer, which is 200 also when the call fails:
    `status` is `error` when the server cannot be reached (also while listing its tools), times
    out, answers with an HTTP or JSON-RPC error, or returns a result with `isError: true`;
    `error_message` says why."""
    app = request.app
    upstream = await _upstream(request, server_id)
    if upstream.rules is not None:
        await _govern(app, upstream, body.tool_name, request.get(TRACE))
    # It holds an upstream connection as a proxied request does: counted with them.
    with app[PROXYING].in_flight.holding(upstream.workspace_id):
        return await _invoke(app, request, upstream, body)


async def _govern(
    app: web.Application, upstream: Upstream, tool_name: str, trace: Trace | None
) -> None:
    """The server's rules, as the proxy applies them (a member has no key rules): a refusal
    is logged as a refused tool call (in the request's trace, if it has one), then answered."""
    try:
        decisions.check_tools(None, upstream.rules, [tool_name])
        await decisions.take_calls(app[BUDGETS], None, upstream.rules, 1)
    except decisions.Refused as refused:
        reservation = app[CALL_LOG].reserve(upstream.workspace_id, 1)
        if reservation is not None:
            outcome = _Outcome(None, f"refused: {refused.reason}", 0)
            await app[CALL_LOG].write([_log_row(upstream, tool_name, outcome, trace)], reservation)
            if trace is not None:
                trace.log(outcome.error)
        if refused.status == 429:
            raise TooManyRequests(refused.reason, math.ceil(refused.retry_after)) from None
        raise Forbidden(refused.reason) from None


async def _invoke(
    app: web.Application, request: web.Request, upstream: Upstream, body: InvokeIn
) -> dict[str, Any]:
    started = time.perf_counter()
    failed: _Outcome | None = None
    try:
        listing = await app[TOOL_LISTS].get(upstream)
    except (BadGateway, GatewayTimeout) as exc:
        kind = "timeout" if isinstance(exc, GatewayTimeout) else "tool_list"
        failed = _Outcome(None, exc.detail, _ms_since(started), kind)
        verdict = Verdict.unchecked("the server's tool list could not be read")
    else:
        tool = listing.find(body.tool_name)
        if tool is None:
            raise ValidationFailed(
                f"body.tool_name: the server has no tool named {body.tool_name!r} (tool list "
                f"fetched at {listing.fetched_at.isoformat()}; DELETE the tools cache to refresh)"
            )
        schema = tool["inputSchema"]
        # The list's memory goes back as soon as nothing holds it: not kept for the call.
        del listing, tool
        verdict = await _check_arguments(request, upstream, schema, body.arguments)
    # Room for its row is taken before the call: a call the log could not take would run
    # unlogged.
    reservation = app[CALL_LOG].reserve(upstream.workspace_id, 1)
    if reservation is None:
        raise no_room()
    # Shielded: a caller hanging up (which cancels this handler) must not leave a call made
    # and not logged.
    call, outcome = await asyncio.shield(
        _call_and_log(app, upstream, body, failed, reservation, request.get(TRACE))
    )
    return {
        "tool_call_id": call.id,
        "result": outcome.result,
        "duration_ms": outcome.duration_ms,
        "status": call.status,
        "error_message": call.error_message,
        "arguments_checked": verdict.checked,
        "arguments_unchecked_reason": verdict.reason,
    }


async def _check_arguments(
    request: web.Request, upstream: Upstream, schema: Any, arguments: dict[str, Any]
) -> Verdict:
    """The checker's verdict; 422 if the arguments break the schema."""
    verdict = await request.app[SCHEMA_CHECKER].check(upstream.workspace_id, schema, arguments)
    if verdict.problems:
        raise ValidationFailed("; ".join(_describe(p) for p in verdict.problems))
    if not verdict.checked:
        log.info(
            "arguments of a playground call go unchecked: %s",
            verdict.reason,
            extra={"server_id": str(upstream.id), "workspace_id": str(upstream.workspace_id)},
        )
    return verdict


def _describe(problem: Problem) -> str:
    where = ".".join(["body.arguments", *(str(part) for part in problem.path)])
    return f"{where}: {problem.message}"


async def _call_and_log(
    app: web.Application,
    upstream: Upstream,
    body: InvokeIn,
    failed: _Outcome | None,
    reservation: Reservation,
    trace: Trace | None,
) -> tuple[ToolCall, _Outcome]:
    if failed is not None:
        outcome = failed
    elif trace is None:
        outcome = await _call(app, upstream, body.tool_name, body.arguments)
    else:
        outcome = await _traced_call(app, upstream, body.tool_name, body.arguments)
    call = _log_row(upstream, body.tool_name, outcome, trace)
    # Awaited: the returned tool_call_id is in GET /tool-calls as soon as the handler answers.
    await app[CALL_LOG].write([call], reservation)
    if trace is not None:
        trace.log(outcome.error, outcome.kind)
    return call, outcome


async def _traced_call(
    app: web.Application, upstream: Upstream, name: str, arguments: dict[str, Any]
) -> _Outcome:
    """The call as a CLIENT span under the request's, its context sent upstream in the
    `traceparent` header of each of the call's requests (connecting included), and in the
    `tools/call`'s `_meta` (where the official SDK's servers look for it)."""
    tracing = app[TRACING]
    assert tracing is not None  # (a request has a trace only while tracing is on)
    attributes = {
        METHOD: "tools/call",
        TOOL: name,
        OPERATION: "execute_tool",
        SERVER: str(upstream.id),
        **peer(upstream.url),
    }
    headers: dict[str, str] = {}
    with tracing.span(f"tools/call {name}", attributes, headers=headers) as span:
        outcome = await _call(app, upstream, name, arguments, headers)
        if outcome.error is not None:
            set_failed(span, error_type(outcome.error, outcome.kind), outcome.error)
    return outcome


async def _call(
    app: web.Application,
    upstream: Upstream,
    name: str,
    arguments: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> _Outcome:
    started = time.perf_counter()
    timeout = app[SETTINGS].proxy_timeout_seconds
    memory = app[TOOL_LIST_MEMORY]
    try:
        # A 2026-07-28 server may make the client list its tools first: within the same bounds.
        async with mcp_session(app[HTTP], upstream, timeout, memory, headers) as client:
            result = await client.call_tool(name, arguments, headers)
            duration_ms = _ms_since(started)  # ending the session is not part of the call
    except McpError as exc:
        return _Outcome(None, shorten(str(exc)), _ms_since(started), error_kind(exc))
    if result.get("isError") is True:
        return _Outcome(result, failed_result_text(result), duration_ms)
    return _Outcome(result, None, duration_ms)


def _log_row(
    upstream: Upstream, tool_name: str, outcome: _Outcome, trace: Trace | None
) -> ToolCall:
    failed = outcome.error is not None
    size = None if outcome.result is None else len(orjson.dumps(outcome.result))
    return ToolCall(
        id=new_call_id(),
        workspace_id=upstream.workspace_id,
        server_id=upstream.id,
        tool_name=clean_text(tool_name) or UNNAMED_TOOL,
        caller_agent=PLAYGROUND_AGENT,
        status="error" if failed else "success",
        duration_ms=outcome.duration_ms,
        input_tokens=None,
        output_tokens=None,
        output_size_bytes=size,
        error_message=clean_text(outcome.error),
        created_at=datetime.now(UTC),
        trace_id=None if trace is None else trace.trace_id,
    )


def _ms_since(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)
