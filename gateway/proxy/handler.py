"""The transparent MCP proxy's handler: the exchange with the upstream, streamed back.

Per request: the caller is authenticated and the server looked up from in-process caches
(api/routing, upstreams), the request admitted (admission), its calls read (requests) and
their room in the call log reserved, the body forwarded byte for byte with the MCP headers
(headers: the caller's credentials replaced by the server's), and the upstream status,
headers and body streamed back as they arrive, the reply read on the way (replies). Each
`tools/call` becomes a row of the call log once its outcome is known (outcome). Browsers may
call it from any origin (cors).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from opentelemetry.trace import Span
from pydantic import Field

from gateway.accounts.access import MCP, PRINCIPAL, Access
from gateway.api.models import Out
from gateway.api.routing import Routes, read_bytes
from gateway.caching.caches import MISSING
from gateway.calllog.writer import CALL_LOG, CallLog, Reservation, no_room
from gateway.errors import (
    ApiError,
    BadGateway,
    GatewayTimeout,
    JsonRpcRefusal,
    NotFound,
    PayloadTooLarge,
)
from gateway.keys import HTTP, SETTINGS
from gateway.mcp.tool_list_budget import MAX_TOOL_LIST_BYTES, MiB
from gateway.ops.metrics import METRICS, Metrics
from gateway.ops.tracing import (
    METHOD,
    SERVER,
    STATUS_CODE,
    TOOL,
    TRACE,
    TRACING,
    Trace,
    Tracing,
    describe,
    peer,
    set_failed,
    span_name,
)
from gateway.policy.budgets import BUDGETS, Budgets
from gateway.policy.tool_lists import filter_reply, tools_list_ids
from gateway.proxy import cors
from gateway.proxy.admission import LARGE_BODY_BYTES, InFlight, LargeBodies, process_stream_bound
from gateway.proxy.governing import Filtering, govern
from gateway.proxy.headers import (
    PASS_BACK,
    SKIP_AUTO_HEADERS,
    UpstreamResponse,
    UpstreamStream,
    is_event_stream,
    sends_auto_headers,
    upstream_headers,
)
from gateway.proxy.outcome import Outcome, caller_agent, count_exchange, record_calls
from gateway.proxy.replies import ListTap, ReplyReader, read_reply
from gateway.proxy.requests import ToolCallSeen, UnreadableRequest, tool_calls_in
from gateway.proxy.tasks import TASK_FOLLOWER, TaskFollower
from gateway.security.outbound import RefusedAddress
from gateway.upstreams.fingerprints import TOOL_WATCH, ToolWatch
from gateway.upstreams.servers import UPSTREAMS, Upstream, Upstreams

log = logging.getLogger(__name__)

routes = Routes("proxy")

PROXY_PATH = "/proxy/{server_id}/mcp"

# Non-streamed replies up to this size are read whole and sent in one write (see _exchange).
_BUFFERED_REPLY_BYTES = 1 << 20
# How often an idle server-initiated (GET) stream checks that its client is still there.
_CLIENT_CHECK_SECONDS = 15.0
# For the OpenAPI document only: the proxy passes both through without validating them.
JsonRpcMessage = Annotated[
    Any, Field(description="any MCP JSON-RPC message or batch, forwarded byte for byte")
]
UpstreamReply = Annotated[
    Any,
    Field(
        description="the server's answer, unchanged: JSON, or an SSE stream "
        "(text/event-stream) when the server streams"
    ),
]


class JsonRpcErrorObject(Out):
    code: int = Field(
        description="-32700: the body cannot be read; -32600: a batch too large; -32020: the "
        "Mcp-Name header disagrees with the body; -32003: a tool the rules refuse; -32029: "
        "over a rate limit"
    )
    message: str


class JsonRpcErrorResponse(Out):
    """The gateway's own refusal of an MCP request, in JSON-RPC: nothing was forwarded."""

    jsonrpc: Literal["2.0"]
    id: str | int | None
    error: JsonRpcErrorObject


class Refusal(Out):
    """A refusal of the request as a whole (the key's scope, the workspace's bounds)."""

    detail: str


# Governed access answers a refused tools/call to its id (a batch with one error per call);
# other refusals of the same status are {"detail": ...}.
RuledOut = Annotated[
    Refusal | JsonRpcErrorResponse | list[JsonRpcErrorResponse],
    Field(description="a refused tools/call: a JSON-RPC error to its id; else {detail}"),
]


@dataclass(frozen=True, slots=True)
class Proxying:
    """What the proxy uses on every request, in one place: one lookup per request instead of
    one per item (aiohttp's app[key] is a Python call)."""

    upstreams: Upstreams
    http: aiohttp.ClientSession
    call_log: CallLog
    metrics: Metrics
    max_body_bytes: int
    timeout_seconds: float
    # Requests in flight (each holds two connections, a stream for as long as it runs), by
    # workspace and in all: one tenant's thousands of open streams must not use up the
    # process's file descriptors, which every other tenant's requests and logins need.
    in_flight: InFlight
    large_bodies: LargeBodies
    # Rate limits' budgets (governed access).
    budgets: Budgets
    # Calls that became tasks, followed until a reply ends them (in any process).
    tasks: TaskFollower
    # Where relayed tool lists are fingerprinted (tool integrity), after the reply.
    watch: ToolWatch
    # OpenTelemetry (None: off, and the exchange pays one test for it).
    tracing: Tracing | None

    @classmethod
    async def setup(cls, app: web.Application) -> None:
        """on_startup, once the cleanup contexts have made what it refers to."""
        settings = app[SETTINGS]
        app[PROXYING] = cls(
            app[UPSTREAMS],
            app[HTTP],
            app[CALL_LOG],
            app[METRICS],
            settings.max_body_bytes,
            settings.proxy_timeout_seconds,
            InFlight(settings.max_streams_per_workspace, process_stream_bound()),
            LargeBodies(),
            app[BUDGETS],
            app[TASK_FOLLOWER],
            app[TOOL_WATCH],
            app[TRACING],
        )


class _CallerLeft(Exception):
    """Writing to the caller failed: it hung up. Not an OSError, so never taken for the
    upstream's failure (aiohttp's ClientConnectionResetError is both)."""


@routes.route(
    "POST",
    PROXY_PATH,
    summary="Forward an MCP request to a registered server",
    access=MCP,
    request_body=JsonRpcMessage,
    response=UpstreamReply,
    errors=(404, 408, 413, 415, 429, 502, 503, 504),
    error_bodies={400: JsonRpcErrorResponse, 403: RuledOut, 429: RuledOut},
)
@routes.route(
    "GET",
    PROXY_PATH,
    summary="Open the server-initiated SSE stream of an MCP session",
    access=MCP,
    errors=(404, 415, 429, 502, 504),
)
@routes.route(
    "DELETE",
    PROXY_PATH,
    summary="End an MCP session on the server",
    access=MCP,
    errors=(404, 415, 429, 502, 504),
)
async def proxy(request: web.Request, server_id: uuid.UUID) -> web.StreamResponse:
    """Transparent streamable-HTTP proxy: the request is forwarded unchanged (with the server's
    stored credentials instead of yours) and the server's status, MCP headers and body come back
    unchanged, SSE streamed event by event. Every `tools/call` (also inside a JSON-RPC batch) is
    logged as a tool call, `error` when the HTTP status is not 2xx, the exchange failed, or its
    JSON-RPC response is an error or a result with `isError: true`; `X-Caller-Agent` names the
    caller (without it, an OAuth token's client, by name). An unreachable server is 502, one
    that does not answer within GATEWAY_PROXY_TIMEOUT_SECONDS 504 (a stream that keeps sending
    is never cut; one silent for that long is), and one that answers a status outside
    200..599 (a 101 included) 502.

    A call is logged once, when it ends (2026-07-28). A result with `resultType:
    "input_required"` is no row: the client retries the call with `inputResponses`, and the
    retry is logged when it ends (its duration is that last exchange's). A task handle
    (`resultType: "task"`, or 2025-11-25's `{"task": ...}`) is stored in the database before it
    is passed on, and the call logged when the reply to a `tasks/get` (or `tasks/result`,
    `tasks/cancel`) that ends the task passes through any gateway process (its duration runs
    from the `tools/call` to that reply), or as an error once the task expired unseen.

    Refused before anything is forwarded: a body that is not valid UTF-8, nests deeper than 64
    levels, names a deciding key (`method`, `params`, `name`) twice in one object, or may hold a
    `tools/call` but is not JSON, with a JSON-RPC parse error (-32700, HTTP 400); a batch of
    more than 100 messages (-32600, HTTP 400); a request of a workspace that already has
    GATEWAY_MAX_STREAMS_PER_WORKSPACE requests (streams included) in flight in this process
    (429); calls the tool call log has no room for now (503): calls are never forwarded
    unlogged.

    Governed access (docs/behaviour.md): an API key without the `proxy` permission, or whose
    `allowed_servers` leave this server out, is 403 {"detail"} for every method; a `tools/call`
    of a tool outside the key's `allowed_tools`, in the server's `disabled_tools`, or (a server
    with `pin_tools`) new or changed since approved, is 403 with a JSON-RPC error -32003 to its
    id, and one over the key's or the server's `rate_limit` 429
    with Retry-After and -32029; each refused call is logged (`error`, "refused: ..."). A
    `tools/list` reply is cut to the tools the caller may call when a tool rule applies to it,
    and marked `cacheScope: "private"`; every other reply passes byte for byte. A 2xx
    `tools/list` reply is fingerprinted per tool once relayed (GET
    /servers/{id}/tools/changes).

    Credentials: an API key, an access token, or an OAuth access token issued for this very
    URL (its `resource`, RFC 8707; docs/behaviour.md, "OAuth tokens on MCP URLs"), which acts
    as the member who consented until they leave the workspace or the grant is revoked. When
    the gateway offers OAuth (an https or loopback PUBLIC_URL), a 401 carries
    `WWW-Authenticate: Bearer resource_metadata="<PUBLIC_URL>/.well-known/
    oauth-protected-resource/api/v1/proxy/{server_id}/mcp"` (RFC 9728), with
    `error="invalid_token"` when the credential sent was refused."""
    started = time.perf_counter()
    proxying = request.app[PROXYING]
    principal = request[PRINCIPAL]
    workspace_id = principal.workspace_id
    upstreams = proxying.upstreams
    upstream = upstreams.peek(server_id, workspace_id)  # no coroutine on a cache hit
    if upstream is MISSING:
        upstream = await upstreams.get(server_id, workspace_id)
    if upstream is None:
        raise NotFound("server not found")
    # Counted in flight (InFlight, inlined: every proxied call pays for each Python call).
    in_flight = proxying.in_flight
    slot = in_flight.by_workspace.get(workspace_id) or in_flight.slot(workspace_id)
    if slot[0] >= in_flight.per_workspace or in_flight.count >= in_flight.total:
        in_flight.refuse(slot[0])
    slot[0] += 1
    in_flight.count += 1
    try:  # (one coroutine, not two: every proxied call pays for each)
        headers = upstream_headers(request.headers, upstream.auth_headers)
        body = b""
        calls: list[ToolCallSeen] = []
        filtering: Filtering | None = None
        if request.body_exists:
            if (request.content_length or 0) > proxying.max_body_bytes:
                raise PayloadTooLarge(f"request body over {proxying.max_body_bytes} bytes")
            # Complete already (most): read without read_bytes()'s timer and extra coroutine.
            body = await (request.read() if request.content.is_eof() else read_bytes(request))
            if body:
                try:
                    if len(body) > LARGE_BODY_BYTES:
                        calls = await proxying.large_bodies.read(workspace_id, body)
                    else:
                        calls = tool_calls_in(body)
                except UnreadableRequest as exc:
                    raise JsonRpcRefusal(400, exc.code, exc.message) from None
                if not calls:
                    # A tools/list's reply is fingerprinted (tool integrity) once relayed;
                    # a tools/call pays only the check above.
                    listing = tools_list_ids(body)
                    filtering = None if listing is None else Filtering(listing, None, body)
        if principal.rules is not None or upstream.rules is not None:
            # Governed access: only for callers a rule applies to (one check for the others).
            filtering = await govern(
                request,
                proxying.budgets,
                proxying.call_log,
                principal.rules,
                upstream,
                body,
                calls,
                started,
            )
        return await forward(request, proxying, upstream, headers, body, calls, started, filtering)
    finally:
        slot[0] -= 1
        in_flight.count -= 1


async def forward(
    request: web.Request,
    proxying: Proxying,
    upstream: Upstream,
    headers: CIMultiDict[str],
    body: bytes,
    calls: list[ToolCallSeen],
    started: float,
    filtering: Filtering | None = None,
    *,
    toolset_id: uuid.UUID | None = None,
    pass_back: tuple[str, ...] = PASS_BACK,
) -> web.StreamResponse:
    """Send a request the rules let through to the upstream and stream its reply back; its
    `tools/call`s are logged when the reply ends. The proxy's, and a toolset's for a call it
    routes to a member (its `toolset_id` on the rows, its own `pass_back` headers)."""
    reservation: Reservation | None = None
    if calls:
        # Forwarded, calls the log has no room for would run unlogged (it is full, or this
        # workspace holds its share): refused before anything is sent. Their rows are added
        # when the reply ends.
        reservation = proxying.call_log.reserve(upstream.workspace_id, len(calls))
        if reservation is None:
            raise no_room()
    outcome = Outcome(calls, started, reservation, toolset_id)
    exchange = None
    if proxying.tracing is not None:
        outcome.trace = request.get(TRACE)
        if outcome.trace is not None:
            exchange, body = _traced_exchange(
                proxying.tracing, outcome.trace, request, upstream, headers, body
            )
    try:
        return await _exchange(
            request, proxying, upstream, headers, body, outcome, filtering, pass_back
        )
    except asyncio.CancelledError:
        # aiohttp cancels the handler when the caller hangs up (handler_cancellation), and
        # when the gateway shuts down, which leaves the caller's connection open until then.
        if _caller_gone(request):
            outcome.cancelled = True
        elif outcome.error is None:
            outcome.error = "the gateway shut down before the response arrived"
            outcome.kind = "shutdown"
        raise
    finally:
        if reservation is not None:
            record_calls(
                request,
                proxying.call_log,
                reservation,
                upstream,
                outcome,
                started,
                proxying.tasks,
                toolset_id,
            )
        count_exchange(proxying.metrics, request.method, upstream.id, outcome, started)
        if exchange is not None:
            _exchanged(exchange, outcome)


def _traced_exchange(
    tracing: Tracing,
    trace: Trace,
    request: web.Request,
    upstream: Upstream,
    headers: CIMultiDict[str],
    body: bytes,
) -> tuple[Span | None, bytes]:
    """The exchange's CLIENT span, its context set in the headers (and the body's `_meta`).
    A request whose trace is not sampled records nothing: its own context goes upstream, as
    not sampled, and no span is made for the exchange."""
    if not trace.span.is_recording():
        tracing.propagate(trace, headers)
        return None, body
    method, described = describe(body)
    # What the exchange adds to its parent's attributes: the method and tool as the server
    # hears them (a toolset's names are its own), and where it went. (Every attribute costs
    # each traced request microseconds, kept and encoded, so only these.)
    attributes = peer(upstream.url)
    for key in (METHOD, TOOL):
        if key in described:
            attributes[key] = described[key]
    attributes[SERVER] = str(upstream.id)
    name = span_name(method, described, request.method)
    return tracing.exchange(trace, name, attributes, headers, body)


def _exchanged(span: Span, outcome: Outcome) -> None:
    """The exchange's span ends: ERROR when it failed, or the upstream answered a 5xx."""
    if outcome.status:
        span.set_attribute(STATUS_CODE, outcome.status)
    if outcome.kind:
        set_failed(span, outcome.kind, outcome.error)
    elif outcome.status >= 500:
        set_failed(span, str(outcome.status))
    span.end()


@functools.cache
def _timeout(seconds: float, is_get: bool) -> aiohttp.ClientTimeout:
    # Silence is bounded, not length: a stream may send for as long as it likes. A GET stream
    # (server-initiated messages) may even be silent: see _pump.
    return aiohttp.ClientTimeout(
        total=None, sock_connect=seconds, sock_read=None if is_get else seconds
    )


async def _exchange(
    request: web.Request,
    proxying: Proxying,
    upstream: Upstream,
    headers: CIMultiDict[str],
    body: bytes,
    outcome: Outcome,
    filtering: Filtering | None,
    pass_back: tuple[str, ...],
) -> web.StreamResponse:
    timeout_seconds = proxying.timeout_seconds
    is_get = request.method == "GET"
    outcome.forwarded_at = time.perf_counter()
    try:
        reply = await proxying.http.request(
            request.method,
            upstream.url,
            data=body or None,
            headers=headers,
            # Costly per request in aiohttp, so only when it would add one of them.
            skip_auto_headers=None if sends_auto_headers(headers) else SKIP_AUTO_HEADERS,
            allow_redirects=False,
            timeout=_timeout(timeout_seconds, is_get),
        )
    except TimeoutError:
        outcome.error = f"upstream timed out after {timeout_seconds:g} s"
        outcome.kind = "timeout"
        raise GatewayTimeout(outcome.error) from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        outcome.error = f"upstream unreachable: {_describe(exc)}"
        refused = isinstance(getattr(exc, "os_error", exc), RefusedAddress)
        outcome.kind = "refused" if refused else "unreachable"
        raise BadGateway(outcome.error) from None
    async with reply:
        outcome.status = reply.status
        if not 200 <= reply.status <= 599:
            # 1xx (a 101 would turn the caller's connection into a raw tunnel past the
            # gateway) and made-up statuses are not HTTP answers to relay.
            outcome.error = f"upstream answered HTTP {reply.status}, which is not relayed"
            outcome.kind = "bad_status"
            raise BadGateway(outcome.error)
        # Not CIMultiDict[str](): calling the generic alias costs eight times as much.
        headers = CIMultiDict()
        for name in pass_back:
            value = reply.headers.get(name)
            if value is not None:
                headers[name] = value
        if "Origin" in request.headers:
            headers.update(cors.ANSWER_HEADERS)
        content_type = reply.headers.get("Content-Type")
        is_stream = is_event_stream(content_type)
        length = reply.content_length
        if filtering is not None and 200 <= reply.status < 300:
            if filtering.visible is not None:
                filtered = await _filtered(
                    request, proxying, upstream, reply, headers, outcome, filtering, is_stream
                )
                filtered.bare = content_type is None
                return filtered
            # A `tools/list` reply nothing is cut from: streamed as it comes, a copy read on
            # the way for its fingerprints (tool integrity). Its request held no calls.
            outcome.reader = ListTap(
                proxying.watch,
                upstream.id,
                upstream.workspace_id,
                is_stream,
                filtering.ids,
                filtering.sent,
            )
        elif not is_stream and length is not None and length <= _BUFFERED_REPLY_BYTES:
            # Most tools/call answers: a small JSON reply of known length, read whole and sent
            # in one write. Nothing has been sent yet when the upstream fails here, so the
            # caller gets a 502. (Here rather than in a coroutine of its own: each level of
            # coroutines costs every proxied call at each of its awaits.)
            try:
                body = await reply.read()
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise _failed_read(outcome, exc, timeout_seconds) from None
            handles = _read_whole(outcome, body)
            if handles:
                await _follow(request, proxying, upstream, outcome, handles)
            if outcome.calls:
                _delivered(request, outcome)
            buffered = UpstreamResponse(body=body, status=reply.status, headers=headers)
            buffered.bare = content_type is None
            return buffered
        outcome.answered_at = time.perf_counter()  # (a buffered reply: read_at)
        if outcome.calls:
            outcome.reader = ReplyReader(outcome.calls, event_stream=is_stream)
        # The reason phrase is HTTP's own for the status: the upstream's may hold anything.
        response = UpstreamStream(status=reply.status, headers=headers)
        response.bare = content_type is None
        if is_stream:
            response.headers["X-Accel-Buffering"] = "no"
        elif length is not None:
            response.content_length = length
        try:
            await response.prepare(request)
            await _pump(request, proxying, upstream, reply, response, outcome, is_get)
        except _CallerLeft:
            outcome.cancelled = True
            log.debug("proxy to %s: the caller went away", reply.url)
    return response


def _read_whole(outcome: Outcome, body: bytes) -> Sequence[ToolCallSeen]:
    """A reply read whole: its calls judged by it. Returns those it turned into tasks."""
    outcome.read_at = time.perf_counter()
    outcome.size = len(body)
    return read_reply(outcome.calls, body) if outcome.calls else ()


def _delivered(request: web.Request, outcome: Outcome) -> None:
    """The reply's responses reach the caller, unless it waited for the upstream and then
    hung up."""
    if _caller_gone(request):
        outcome.cancelled = True
    else:
        for call in outcome.calls:
            call.relayed = call.answered


async def _filtered(
    request: web.Request,
    proxying: Proxying,
    upstream: Upstream,
    reply: aiohttp.ClientResponse,
    headers: CIMultiDict[str],
    outcome: Outcome,
    filtering: Filtering,
    is_stream: bool,
) -> UpstreamResponse:
    """A `tools/list` reply for a caller a tool rule applies to: read whole (JSON or an SSE
    stream, up to the tool list bound), cut to the tools it may call, sent in one write."""
    received = bytearray()
    try:
        async for chunk in reply.content.iter_any():
            received += chunk
            if len(received) > MAX_TOOL_LIST_BYTES:
                outcome.error = "the tool list is too large to filter"
                outcome.kind = "broke_off"
                raise BadGateway(f"{outcome.error} (over {MAX_TOOL_LIST_BYTES // MiB} MiB)")
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise _failed_read(outcome, exc, proxying.timeout_seconds) from None
    outcome.read_at = time.perf_counter()
    body = bytes(received)
    outcome.size = len(body)
    if outcome.calls:  # a batch may hold calls beside the list
        reader = outcome.reader = ReplyReader(outcome.calls, event_stream=is_stream)
        reader.feed(body)
        if reader.finish():
            await _follow(request, proxying, upstream, outcome, reader.take_handles())
        reader.delivered()
    ids, visible, sent = filtering.ids, filtering.visible, filtering.sent
    assert visible is not None
    # Parsed later, from the bytes as the server sent them (the filtered copy is the caller's).
    proxying.watch.relayed(upstream.id, upstream.workspace_id, body, is_stream, ids, sent)
    return UpstreamResponse(
        body=filter_reply(body, is_stream, ids, visible), status=reply.status, headers=headers
    )


async def _pump(
    request: web.Request,
    proxying: Proxying,
    upstream: Upstream,
    reply: aiohttp.ClientResponse,
    response: web.StreamResponse,
    outcome: Outcome,
    is_get: bool,
) -> None:
    """Copy the body chunk by chunk as it arrives, read by the outcome's reader on the way.
    Raises _CallerLeft when a write to the caller fails. When the upstream fails mid-body the
    caller's connection is closed, so it sees a truncated response rather than a
    complete-looking one."""
    content = reply.content
    reader = outcome.reader
    try:
        if not is_get:
            async for chunk in content.iter_any():
                outcome.size += len(chunk)
                if reader is not None and reader.feed(chunk):
                    await _follow(request, proxying, upstream, outcome, reader.take_handles())
                try:
                    await response.write(chunk)
                except ConnectionError:
                    raise _CallerLeft from None
                if reader is not None:
                    reader.delivered()
        else:
            while True:
                try:
                    async with asyncio.timeout(_CLIENT_CHECK_SECONDS):
                        chunk = await content.readany()
                except TimeoutError:
                    if _caller_gone(request):
                        raise _CallerLeft from None
                    continue
                if not chunk:
                    break
                outcome.size += len(chunk)
                try:
                    await response.write(chunk)
                except ConnectionError:
                    raise _CallerLeft from None
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        _stopped_mid_response(outcome, exc, proxying.timeout_seconds)
    else:
        if reader is not None:
            if reader.finish():
                # A streamed JSON reply is read once it has passed: a poll may have overtaken
                # this handle (then the task's end is logged when it expires).
                await _follow(request, proxying, upstream, outcome, reader.take_handles())
            reader.delivered()
        try:
            await response.write_eof()
        except ConnectionError:
            raise _CallerLeft from None
        return
    log.warning("proxy to %s: %s", reply.url, outcome.error)
    if request.transport is not None:
        request.transport.close()


async def _follow(
    request: web.Request,
    proxying: Proxying,
    upstream: Upstream,
    outcome: Outcome,
    handles: Sequence[ToolCallSeen],
) -> None:
    """Calls the reply turned into tasks: stored before the handles are passed on, so that
    the reply ending a task, in any process, finds its call (gateway/proxy/tasks). A handle in
    a reply that is not 2xx is judged by the status, as the rest of that reply."""
    if not 200 <= outcome.status < 300 or outcome.reservation is None:
        return
    job = proxying.tasks.follow(
        upstream,
        handles,
        outcome.reservation,
        caller_agent(request),
        outcome.started,
        outcome.toolset_id,
    )
    # Shielded: a caller hanging up meanwhile cancels only the wait, and the job still
    # accounts for each call (followed, or logged at once).
    await asyncio.shield(job)


def _stopped_mid_response(outcome: Outcome, exc: BaseException, timeout_seconds: float) -> None:
    """Why the upstream's reply stopped part-way: silent too long, or broken off."""
    if isinstance(exc, TimeoutError):  # (an OSError too: tested first)
        outcome.error = f"upstream went silent for {timeout_seconds:g} s mid-response"
        outcome.kind = "timeout"
    else:
        outcome.error = f"upstream broke off the response: {_describe(exc)}"
        outcome.kind = "broke_off"


def _failed_read(outcome: Outcome, exc: BaseException, timeout_seconds: float) -> ApiError:
    """The answer to a reply read whole that stopped part-way (nothing was sent yet)."""
    _stopped_mid_response(outcome, exc, timeout_seconds)
    if outcome.kind == "timeout":
        return GatewayTimeout(outcome.error or "")
    return BadGateway(outcome.error or "")


def _caller_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error) or type(exc.os_error).__name__
        return f"cannot connect to {exc.host}:{exc.port}: {reason}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@routes.route(
    "OPTIONS",
    PROXY_PATH,
    summary="CORS preflight for browser MCP clients",
    # Browsers send preflights without credentials.
    access=Access(authenticated=False, api_key=True),
    status=204,
)
async def preflight(request: web.Request, server_id: uuid.UUID) -> web.Response:
    return cors.preflight(request)


# What the proxy uses on every request (set once the cleanup contexts have run).
PROXYING: web.AppKey[Proxying] = web.AppKey("proxying")
