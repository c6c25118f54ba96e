"""The transparent MCP proxy: the hot path from agents to their upstream servers.

Per request: the caller is authenticated and the server looked up from in-process caches, the
body is forwarded byte for byte with the MCP headers (the caller's credentials replaced by the
server's), and the upstream status, headers and body are streamed back as they arrive. Each
`tools/call` in the body becomes one entry of the call log, queued without waiting. Browsers
may call it from any origin (gateway/cors.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, NoReturn

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from pydantic import Field

from gateway.accounts.access import PRINCIPAL, USE, Access
from gateway.api.models import Out
from gateway.api.routing import Routes, read_bytes
from gateway.caching.caches import MISSING
from gateway.calllog.writer import (
    CALL_LOG,
    CallLog,
    Reservation,
    ToolCall,
    clean_text,
    new_call_id,
    no_room,
)
from gateway.errors import (
    BadGateway,
    GatewayTimeout,
    JsonRpcRefusal,
    NotFound,
    PayloadTooLarge,
    TooManyRequests,
    UnsupportedMediaType,
)
from gateway.keys import HTTP, SETTINGS
from gateway.ops.metrics import METRICS, Metrics, observe
from gateway.proxy import cors
from gateway.proxy.calls import (
    CALLER_CANCELLED,
    ReplyReader,
    ToolCallSeen,
    UnreadableRequest,
    read_reply,
    tool_calls_in,
)
from gateway.security.outbound import RefusedAddress
from gateway.upstreams.servers import UPSTREAMS, Upstream, Upstreams

log = logging.getLogger(__name__)

routes = Routes("proxy")

PROXY_PATH = "/proxy/{server_id}/mcp"

# Request headers sent upstream (plus every Mcp-Param-*); everything else stays here: hop-by-hop
# headers, Host, Content-Length, Origin, and the caller's Authorization, X-API-Key and Cookie.
_FORWARD = frozenset(
    {
        "accept",
        "content-type",
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
        "mcp-method",
        "mcp-name",
        "traceparent",
        "tracestate",
        "user-agent",
    }
)
_FORWARD_PREFIX = "mcp-param-"
# Response headers passed back. Content-Encoding too: should an upstream compress although we
# ask for identity, the bytes are passed through unchanged and must stay labelled.
_PASS_BACK = (
    "Content-Type",
    "Content-Encoding",
    "Mcp-Session-Id",
    "Cache-Control",
    "Allow",
    "Retry-After",
)
# aiohttp would add its own; a transparent proxy sends only what the caller sent.
_SKIP_AUTO_HEADERS = frozenset({"User-Agent", "Accept"})


def _sends_auto_headers(headers: CIMultiDict[str]) -> bool:
    return "User-Agent" in headers and "Accept" in headers


# Non-streamed replies up to this size are read whole and sent in one write (see _buffered).
_BUFFERED_REPLY_BYTES = 1 << 20
# How often an idle server-initiated (GET) stream checks that its client is still there.
_CLIENT_CHECK_SECONDS = 15.0
# X-Caller-Agent is free text from a header; stored as the tool name is (and indexed: PostgreSQL
# refuses index entries over 2,704 bytes).
_MAX_CALLER_AGENT = 255

CALLER_HUNG_UP = f"{CALLER_CANCELLED}: it went away before the response arrived"
_NO_RESPONSE = "the upstream's reply holds no response to this call"


@functools.lru_cache(maxsize=1024)  # callers send the same few header names again and again
def _forwarded(name: str) -> bool:
    lowered = name.lower()
    return lowered in _FORWARD or lowered.startswith(_FORWARD_PREFIX)


@functools.lru_cache(maxsize=512)  # a client sends the same header names on every request
def _forwarded_positions(
    names: tuple[str, ...], connection: str | None
) -> tuple[tuple[int, ...], int]:
    """Which of the request's headers go upstream, by position: forwarded ones, unless the
    Connection header names them (hop-by-hop); and where the Content-Type is among them (-1:
    none; aiohttp refuses a request with two)."""
    hop_by_hop = set()
    if connection:
        hop_by_hop = {token.strip().lower() for token in connection.split(",")}
    positions = tuple(
        i for i, name in enumerate(names) if _forwarded(name) and name.lower() not in hop_by_hop
    )
    types = [i for i in positions if names[i].lower() == "content-type"]
    return positions, types[0] if types else -1


def upstream_headers(
    incoming: CIMultiDictProxy[str], auth_headers: dict[str, str]
) -> CIMultiDict[str]:
    """The headers sent upstream. A body the gateway reads is read as UTF-8, so a request
    that tells the server otherwise (a charset that is not UTF-8) is refused (415): a server
    decoding it as UTF-7, say, would find calls the gateway never saw."""
    items = list(incoming.items())
    forwarded, content_type_at = _forwarded_positions(
        tuple([name for name, _ in items]), incoming.get("Connection")
    )
    if content_type_at >= 0 and items[content_type_at][1] != "application/json":
        _refuse_other_charsets(items[content_type_at][1])  # (the usual value needs no look)
    headers: CIMultiDict[str] = CIMultiDict([items[i] for i in forwarded])
    headers["Accept-Encoding"] = "identity"
    headers.update(auth_headers)
    return headers


@functools.lru_cache(maxsize=256)
def _charset_refusal(content_type: str) -> str | None:
    for parameter in content_type.split(";")[1:]:
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            return f"the gateway reads MCP requests as UTF-8, not {charset or 'no charset'}"
    return None


def _refuse_other_charsets(content_type: str) -> None:
    refusal = _charset_refusal(content_type)
    if refusal is not None:
        raise UnsupportedMediaType(refusal)


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
    code: int = Field(description="-32700: the body cannot be read; -32600: a batch too large")
    message: str


class JsonRpcErrorResponse(Out):
    """The gateway's own refusal of an MCP request, in JSON-RPC: nothing was forwarded."""

    jsonrpc: Literal["2.0"]
    id: str | int | None
    error: JsonRpcErrorObject


class UpstreamResponse(web.Response):
    """An upstream's answer passed back unchanged: its status and body are the server's, not
    the gateway API's (so they follow no schema of ours)."""

    # The upstream sent no Content-Type: aiohttp would add application/octet-stream.
    bare = False

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        _only_upstream_headers(self.headers, self.bare)


class UpstreamStream(web.StreamResponse):
    """An upstream's answer streamed back as it arrives."""

    bare = False

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        _only_upstream_headers(self.headers, self.bare)


def _only_upstream_headers(headers: CIMultiDict[str], bare: bool) -> None:
    """After aiohttp has added its defaults (in _prepare_headers, rather than in an
    on_response_prepare signal, which would cost every response of the gateway two coroutines):
    an upstream's reply carries its own headers only, and HTTP's framing and Date, no aiohttp
    Server, no Content-Type it did not send."""
    headers.popall("Server", None)
    if bare:
        headers.popall("Content-Type", None)


class _Outcome:
    """How a proxied exchange went, for the call log."""

    __slots__ = (
        "answered_at",
        "calls",
        "cancelled",
        "error",
        "forwarded_at",
        "kind",
        "read_at",
        "reader",
        "size",
        "status",
    )

    def __init__(self, calls: list[ToolCallSeen]) -> None:
        self.calls = calls
        self.status = 0
        self.size = 0
        # The exchange failed on the upstream's side (unreachable, timed out, broke off), and
        # the kind of failure for the metrics.
        self.error: str | None = None
        self.kind = ""
        # perf_counter() when the request went upstream, when a streamed reply's headers
        # came, and when a buffered reply had been read whole (0.0: not yet, or not so).
        self.forwarded_at = 0.0
        self.answered_at = 0.0
        self.read_at = 0.0
        # The caller went away before the end of the reply.
        self.cancelled = False
        # Reads the reply for the calls' responses (None: no tools/call, or no reply yet).
        self.reader: ReplyReader | None = None


class InFlight:
    """Proxied requests in flight in this process, by workspace: admitted while the workspace
    holds fewer than `per_workspace` and the process fewer than `total`. The proxy counts in
    each workspace's slot (a one-item list) in place: one dictionary lookup per request."""

    __slots__ = ("by_workspace", "count", "per_workspace", "total")

    def __init__(self, per_workspace: int, total: int) -> None:
        self.by_workspace: dict[uuid.UUID, list[int]] = {}
        self.per_workspace = per_workspace
        self.total = total
        self.count = 0

    def slot(self, workspace_id: uuid.UUID) -> list[int]:
        """A new slot for the workspace (idle ones are dropped now and then)."""
        if len(self.by_workspace) >= _SLOTS_KEPT:
            idle = [key for key, slot in self.by_workspace.items() if not slot[0]]
            for key in idle:
                del self.by_workspace[key]
        slot = self.by_workspace[workspace_id] = [0]
        return slot

    @contextlib.contextmanager
    def holding(self, workspace_id: uuid.UUID) -> Iterator[None]:
        """Count a request of the workspace that holds an upstream connection outside the
        proxy (the playground, an on-demand probe) for as long as the block runs."""
        slot = self.by_workspace.get(workspace_id) or self.slot(workspace_id)
        if slot[0] >= self.per_workspace or self.count >= self.total:
            self.refuse(slot[0])
        slot[0] += 1
        self.count += 1
        try:
            yield
        finally:
            slot[0] -= 1
            self.count -= 1

    def refuse(self, held: int) -> NoReturn:
        """429: the workspace (holding `held`), or the whole process, is at its bound."""
        if held >= self.per_workspace:
            raise TooManyRequests(
                f"this workspace already has {held} proxied requests in flight in this gateway "
                f"process (GATEWAY_MAX_STREAMS_PER_WORKSPACE); close some streams or retry",
                retry_after=1,
            )
        raise TooManyRequests(
            "this gateway process is at its bound of proxied requests in flight; retry",
            retry_after=1,
        )


# Workspaces with a slot before idle ones are dropped.
_SLOTS_KEPT = 10_000

# Bodies larger than this are read one at a time in the process, one per workspace (a body of
# many small arrays or objects holds the event loop while it is parsed: up to MAX_CONTAINERS
# of them, tens of milliseconds), each after the others' requests had their turn.
_LARGE_BODY_BYTES = 64 * 1024


class LargeBodies:
    """Reads large request bodies (tool_calls_in) in turn: one at a time in the process and
    per workspace, each followed by as long for everything else, so one tenant's stream of
    them slows the others' requests by at most one body's reading at a time."""

    def __init__(self) -> None:
        self._turn = asyncio.Lock()
        self._waiting: dict[uuid.UUID, asyncio.Lock] = {}

    async def read(self, workspace_id: uuid.UUID, body: bytes) -> list[ToolCallSeen]:
        lock = self._waiting.get(workspace_id)
        if lock is None:
            lock = self._waiting[workspace_id] = asyncio.Lock()
        try:
            async with lock, self._turn:
                started = time.perf_counter()
                try:
                    return tool_calls_in(body)
                finally:
                    # Everything else gets as long again before the next large body: at most
                    # half of the event loop's time goes to reading them.
                    await asyncio.sleep(time.perf_counter() - started)
        finally:
            if not lock.locked() and self._waiting.get(workspace_id) is lock:
                del self._waiting[workspace_id]


# Descriptors kept for everything but proxied requests (logins, the API, the database pool,
# probes and webhooks), out of the process's limit.
_RESERVED_DESCRIPTORS = 1024


def process_stream_bound() -> int:
    """How many proxied requests this process can hold open at once: two descriptors each
    (the caller's connection and the upstream's), leaving _RESERVED_DESCRIPTORS for the rest.
    The soft limit is raised to the hard one first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            log.info("cannot raise the open file limit from %d", soft)
    return max(64, (soft - _RESERVED_DESCRIPTORS) // 2)


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
        )


class _CallerLeft(Exception):
    """Writing to the caller failed: it hung up. Not an OSError, so never taken for the
    upstream's failure (aiohttp's ClientConnectionResetError is both)."""


@routes.route(
    "POST",
    PROXY_PATH,
    summary="Forward an MCP request to a registered server",
    access=USE,
    request_body=JsonRpcMessage,
    response=UpstreamReply,
    errors=(404, 408, 413, 415, 429, 502, 503, 504),
    error_bodies={400: JsonRpcErrorResponse},
)
@routes.route(
    "GET",
    PROXY_PATH,
    summary="Open the server-initiated SSE stream of an MCP session",
    access=USE,
    errors=(404, 415, 429, 502, 504),
)
@routes.route(
    "DELETE",
    PROXY_PATH,
    summary="End an MCP session on the server",
    access=USE,
    errors=(404, 415, 429, 502, 504),
)
async def proxy(request: web.Request, server_id: uuid.UUID) -> web.StreamResponse:
    """Transparent streamable-HTTP proxy: the request is forwarded unchanged (with the server's
    stored credentials instead of yours) and the server's status, MCP headers and body come back
    unchanged, SSE streamed event by event. Every `tools/call` (also inside a JSON-RPC batch) is
    logged as a tool call, `error` when the HTTP status is not 2xx, the exchange failed, or its
    JSON-RPC response is an error or a result with `isError: true`; `X-Caller-Agent` names the
    caller. An unreachable server is 502, one that does not answer within
    GATEWAY_PROXY_TIMEOUT_SECONDS 504 (a stream that keeps sending is never cut; one silent for
    that long is), and one that answers a status outside 200..599 (a 101 included) 502.

    Refused before anything is forwarded: a body that is not valid UTF-8, nests deeper than 64
    levels, names a deciding key (`method`, `params`, `name`) twice in one object, or may hold a
    `tools/call` but is not JSON, with a JSON-RPC parse error (-32700, HTTP 400); a batch of
    more than 100 messages (-32600, HTTP 400); a request of a workspace that already has
    GATEWAY_MAX_STREAMS_PER_WORKSPACE requests (streams included) in flight in this process
    (429); calls the tool call log has no room for now (503): calls are never forwarded
    unlogged."""
    started = time.perf_counter()
    proxying = request.app[PROXYING]
    workspace_id = request[PRINCIPAL].workspace_id
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
        reservation: Reservation | None = None
        if request.body_exists:
            if (request.content_length or 0) > proxying.max_body_bytes:
                raise PayloadTooLarge(f"request body over {proxying.max_body_bytes} bytes")
            # Complete already (most): read without read_bytes()'s timer and extra coroutine.
            body = await (request.read() if request.content.is_eof() else read_bytes(request))
            if body:
                try:
                    if len(body) > _LARGE_BODY_BYTES:
                        calls = await proxying.large_bodies.read(workspace_id, body)
                    else:
                        calls = tool_calls_in(body)
                except UnreadableRequest as exc:
                    raise JsonRpcRefusal(400, exc.code, exc.message) from None
                if calls:
                    # Forwarded, calls the log has no room for would run unlogged (it is
                    # full, or this workspace holds its share): refused before anything is
                    # sent. Their rows are added when the reply ends.
                    reservation = proxying.call_log.reserve(workspace_id, len(calls))
                    if reservation is None:
                        raise no_room()
        outcome = _Outcome(calls)
        try:
            return await _exchange(request, proxying, upstream, headers, body, outcome)
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the caller hangs up (handler_cancellation), and
            # when the gateway shuts down, which leaves the caller's connection open until
            # then.
            if _caller_gone(request):
                outcome.cancelled = True
            elif outcome.error is None:
                outcome.error = "the gateway shut down before the response arrived"
                outcome.kind = "shutdown"
            raise
        finally:
            if reservation is not None:
                _record(request, proxying.call_log, reservation, upstream, outcome, started)
            _count(proxying.metrics, request.method, server_id, outcome, started)
    finally:
        slot[0] -= 1
        in_flight.count -= 1


@functools.lru_cache(maxsize=256)  # aiohttp parses Content-Type afresh for every response
def _is_event_stream(content_type: str | None) -> bool:
    if content_type is None:
        return False
    return content_type.partition(";")[0].strip().lower() == "text/event-stream"


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
    outcome: _Outcome,
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
            skip_auto_headers=None if _sends_auto_headers(headers) else _SKIP_AUTO_HEADERS,
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
        for name in _PASS_BACK:
            value = reply.headers.get(name)
            if value is not None:
                headers[name] = value
        if "Origin" in request.headers:
            headers.update(cors.ANSWER_HEADERS)
        content_type = reply.headers.get("Content-Type")
        is_stream = _is_event_stream(content_type)
        length = reply.content_length
        if not is_stream and length is not None and length <= _BUFFERED_REPLY_BYTES:
            buffered = await _buffered(request, reply, headers, outcome, timeout_seconds)
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
            await _pump(request, reply, response, outcome, timeout_seconds, is_get)
        except _CallerLeft:
            outcome.cancelled = True
            log.debug("proxy to %s: the caller went away", reply.url)
    return response


async def _buffered(
    request: web.Request,
    reply: aiohttp.ClientResponse,
    headers: CIMultiDict[str],
    outcome: _Outcome,
    timeout_seconds: float,
) -> UpstreamResponse:
    """A small JSON reply of known length is read whole and sent in one write: most tools/call
    answers. Nothing has been sent yet when the upstream fails here, so the caller gets a 502."""
    try:
        body = await reply.read()
    except TimeoutError:
        outcome.error = f"upstream went silent for {timeout_seconds:g} s mid-response"
        outcome.kind = "timeout"
        raise GatewayTimeout(outcome.error) from None
    except (aiohttp.ClientError, OSError) as exc:
        outcome.error = f"upstream broke off the response: {_describe(exc)}"
        outcome.kind = "broke_off"
        raise BadGateway(outcome.error) from None
    outcome.read_at = time.perf_counter()
    outcome.size = len(body)
    if outcome.calls:
        read_reply(outcome.calls, body)
        if _caller_gone(request):
            outcome.cancelled = True  # it waited for the upstream, then hung up
        else:
            for call in outcome.calls:
                call.relayed = call.answered
    return UpstreamResponse(body=body, status=reply.status, headers=headers)


async def _pump(
    request: web.Request,
    reply: aiohttp.ClientResponse,
    response: web.StreamResponse,
    outcome: _Outcome,
    timeout_seconds: float,
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
                if reader is not None:
                    reader.feed(chunk)
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
    except TimeoutError:
        outcome.error = f"upstream went silent for {timeout_seconds:g} s mid-response"
        outcome.kind = "timeout"
    except (aiohttp.ClientError, OSError) as exc:
        outcome.error = f"upstream broke off the response: {_describe(exc)}"
        outcome.kind = "broke_off"
    else:
        if reader is not None:
            reader.finish()
            reader.delivered()
        try:
            await response.write_eof()
        except ConnectionError:
            raise _CallerLeft from None
        return
    log.warning("proxy to %s: %s", reply.url, outcome.error)
    if request.transport is not None:
        request.transport.close()


_METHOD_CLASSES = {"GET": "stream", "DELETE": "session_end"}


def _count(
    metrics: Metrics, method: str, server_id: uuid.UUID, outcome: _Outcome, started: float
) -> None:
    """The exchange in the metrics: its class, how it ended, whose time it took. Every
    proxied request pays for this: dictionary updates only, no calls it can do without."""
    forwarded = outcome.forwarded_at
    if not forwarded:
        return  # refused before it went upstream (a body too large, say)
    method_class = _METHOD_CLASSES.get(method) or ("tools_call" if outcome.calls else "request")
    if outcome.cancelled:
        result = "caller_left"
    elif outcome.kind:
        result = outcome.kind
        metrics.upstream_errors.inc(result)
    else:
        result = _STATUS_CLASSES.get(outcome.status // 100, "upstream_other")
        if outcome.status >= 500:
            metrics.upstream_errors.inc("http_5xx")
    key = (method_class, result, str(server_id)) if metrics.per_server else (method_class, result)
    counts = metrics.proxy_requests.values
    counts[key] = counts.get(key, 0) + 1
    # Buffered, the reply's body was the upstream's time too; streamed, its headers end it.
    read = outcome.read_at
    if read:
        waited = read - forwarded
        own = time.perf_counter() - started - waited
    elif outcome.answered_at:
        waited = outcome.answered_at - forwarded
        own = forwarded - started
    else:
        return  # no answer from the upstream
    upstream_time, own_time = metrics.proxy_times[method_class]
    observe(upstream_time, waited)
    observe(own_time, own)


_STATUS_CLASSES = {2: "ok", 3: "upstream_3xx", 4: "upstream_4xx", 5: "upstream_5xx"}


def _caller_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error) or type(exc.os_error).__name__
        return f"cannot connect to {exc.host}:{exc.port}: {reason}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _verdict(call: ToolCallSeen, outcome: _Outcome) -> str | None:
    """Why the call failed, or None when it succeeded. A response that reached the caller
    decides, whatever happened to the connection afterwards."""
    answered = 200 <= outcome.status < 300
    if call.relayed and answered:
        return call.error
    if outcome.error is not None:
        return outcome.error
    if outcome.cancelled:
        return CALLER_HUNG_UP
    if not answered:
        text = f"upstream answered HTTP {outcome.status}"
        return f"{text}: {call.error}" if call.error else text
    reader = outcome.reader
    if call.rid is None or (reader is not None and (reader.blind or reader.resumable)):
        # A notification has no response; an unreadable reply is judged by its status; a
        # resumable stream may deliver the response on another request (2025-11-25 polling).
        return None
    return _NO_RESPONSE


def _record(
    request: web.Request,
    call_log: CallLog,
    reservation: Reservation,
    upstream: Upstream,
    outcome: _Outcome,
    started: float,
) -> None:
    reader = outcome.reader
    answered_at = None if reader is None else reader.answered_at
    duration_ms = round(((answered_at or time.perf_counter()) - started) * 1000)
    caller = request.headers.get("X-Caller-Agent")
    if caller is not None:
        caller = clean_text(caller)[:_MAX_CALLER_AGENT]
    created_at = datetime.now(UTC)
    relayed_ok = 200 <= outcome.status < 300
    for call in outcome.calls:
        # The usual case first, without _verdict's call: its response reached the caller.
        error = call.error if call.relayed and relayed_ok else _verdict(call, outcome)
        call_log.add(
            ToolCall(
                new_call_id(),
                upstream.workspace_id,
                upstream.id,
                call.name,
                caller,
                "success" if error is None else "error",
                duration_ms,
                None,
                None,
                outcome.size,
                error,
                created_at,
            ),
            reservation,
        )


@routes.route(
    "OPTIONS",
    PROXY_PATH,
    summary="CORS preflight for browser MCP clients",
    # Browsers send preflights without credentials.
    access=Access(authenticated=False, api_key=True),
    status=204,
)
async def preflight(request: web.Request, server_id: uuid.UUID) -> web.Response:
    requested = request.headers.get("Access-Control-Request-Headers")
    return web.Response(
        status=204,
        headers={
            **cors.ANSWER_HEADERS,
            "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
            # Echoed, so the caller's Mcp-Param-* headers are allowed too.
            "Access-Control-Allow-Headers": requested or cors.ALLOW_HEADERS,
            "Access-Control-Max-Age": "86400",
        },
    )


# What the proxy uses on every request (set once the cleanup contexts have run).
PROXYING: web.AppKey[Proxying] = web.AppKey("proxying")
