"""Traces: OpenTelemetry spans for what passes through the gateway, exported over OTLP/HTTP.

Off unless OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (and
OTEL_SDK_DISABLED is not true; gateway.config). Off, nothing here runs: the app has no tracing
middleware, and the proxy's exchange tests one attribute. On, the SDK reads the other OTEL_*
variables itself (service name, resource attributes, sampler, batch delays, headers, timeout,
compression), and:

- Each request to a proxy or toolset MCP URL (and each playground invoke) is a SERVER span,
  continuing the caller's W3C `traceparent` (the header, else the message's `_meta`), named
  "{mcp.method.name} {tool}" with the MCP and GenAI attributes (ATTRIBUTES below). Its status
  is ERROR exactly when one of its calls is logged `error`; a request that logged no call is
  ERROR when the answer is a 5xx.
- The exchange with the upstream is a CLIENT span under it, and its context goes upstream: in
  the `traceparent` header, and in place of the value in the message's `_meta.traceparent`
  when the caller put one there (the official SDK's servers read it there). That value is
  rewritten in place, with one of the same length; every other byte is forwarded unchanged.
- Each call's row keeps the trace id (tool_calls.trace_id), which the dashboard links to
  GATEWAY_TRACE_URL.
- Probes, playground exchanges and alert notifications get spans of their own (span()).

Exporting never blocks the event loop: ended spans go to the SDK's batch processor, whose own
thread sends them. When the collector is down or slow its queue fills, and further spans are
dropped and counted (mcp_gateway_trace_spans_total{result="dropped"}); nothing waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final
from urllib.parse import parse_qs

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from yarl import URL

from gateway.config import ConfigError
from gateway.keys import SETTINGS
from gateway.ops.metrics import Reading

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME: Final = "mcp-gateway"
# How long shutdown waits for the last spans to leave (a dead collector must not hold it up).
_SHUTDOWN_SECONDS: Final = 5.0
# A body read again for its method, tool and `_meta` only up to this size (the proxy reads
# larger ones off the event loop; their spans are named from what it found).
_DESCRIBED_BYTES: Final = 1 << 20
_PROPAGATOR: Final = TraceContextTextMapPropagator()
# `"traceparent": "<value>"` in a message's `_meta` (JSON allows whitespace around the colon).
_META_TRACEPARENT: Final = re.compile(rb'"traceparent"\s*:\s*"([^"]{55})"')

# The OpenTelemetry MCP and GenAI semantic conventions' attribute names, and ours.
METHOD: Final = "mcp.method.name"
TOOL: Final = "gen_ai.tool.name"
OPERATION: Final = "gen_ai.operation.name"
PROMPT: Final = "gen_ai.prompt.name"
RESOURCE_URI: Final = "mcp.resource.uri"
REQUEST_ID: Final = "jsonrpc.request.id"
SESSION: Final = "mcp.session.id"
PROTOCOL: Final = "mcp.protocol.version"
ERROR_TYPE: Final = "error.type"
STATUS_CODE: Final = "http.response.status_code"
HTTP_METHOD: Final = "http.request.method"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
WORKSPACE: Final = "mcp_gateway.workspace.id"
SERVER: Final = "mcp_gateway.server.id"
TOOLSET: Final = "mcp_gateway.toolset.id"
BATCH_SIZE: Final = "mcp_gateway.batch.size"
PROBE_STATUS: Final = "mcp_gateway.probe.status"
ALERT_CHANNEL: Final = "mcp_gateway.alert.channel"
ALERT_RULE: Final = "mcp_gateway.alert.rule.id"
ALERT_DELIVERY: Final = "mcp_gateway.alert.delivery.id"
ALERT_ATTEMPT: Final = "mcp_gateway.alert.attempt"
ALERT_RESULT: Final = "mcp_gateway.alert.result"


class Trace:
    """One traced request: its SERVER span, and what the call log said of its calls (the
    span's status follows the rows)."""

    __slots__ = ("failed", "logged", "span", "trace_id")

    def __init__(self, span: Span) -> None:
        self.span = span
        # Kept on the calls' rows only when the span is recorded (sampled): a link to a trace
        # the collector never got would lead nowhere.
        recorded = span.is_recording()
        self.trace_id = format(span.get_span_context().trace_id, "032x") if recorded else None
        self.logged = 0
        # The error.type of the first call logged `error` (None: none was).
        self.failed: str | None = None

    def log(self, error: str | None, kind: str = "") -> None:
        """A call of this request was logged, failed for `error` (None: it succeeded)."""
        self.logged += 1
        if error is not None and self.failed is None:
            self.failed = error_type(error, kind)


TRACE: Final = "gateway.trace"  # request[TRACE]: the request's Trace, while tracing is on


def peer(url: str) -> dict[str, Any]:
    """server.address and server.port of the URL a CLIENT span's request goes to."""
    parsed = URL(url)
    attributes: dict[str, Any] = {SERVER_ADDRESS: parsed.host or ""}
    if parsed.port is not None:
        attributes[SERVER_PORT] = parsed.port
    return attributes


def set_failed(span: Span, kind: str, message: str | None = None) -> None:
    """A span of the gateway's own work failed: ERROR, with its error.type (`kind`)."""
    span.set_attribute(ERROR_TYPE, kind)
    span.set_status(StatusCode.ERROR, message)


def error_type(error: str, kind: str = "") -> str:
    """A low-cardinality error.type for a call logged `error`: the exchange's failure (kind),
    the JSON-RPC error code, `refused`, the upstream's HTTP status, or `tool_error`."""
    if kind:
        return kind
    if error.startswith("refused:"):
        return "refused"
    if error.startswith("JSON-RPC error "):
        return error[len("JSON-RPC error ") :].partition(":")[0]
    if error.startswith("upstream answered HTTP "):
        return error[len("upstream answered HTTP ") :][:3]
    return "tool_error"


class _CountingExporter(SpanExporter):
    """The OTLP exporter, counting what it sent and what it could not (runs in the batch
    processor's thread: each counter is written by that thread only)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.handed = 0
        self.exported = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.handed += len(spans)
        try:
            result = self.inner.export(spans)
        except Exception:  # the SDK logs it; here it only counts
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        else:
            self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class _BoundedBatches(BatchSpanProcessor):
    """The SDK's batch processor, which drops spans when its queue is full; this one counts
    them (the SDK only logs it): a span that would find the queue full is dropped here."""

    def __init__(self, exporter: _CountingExporter) -> None:
        super().__init__(exporter)
        self.exporter = exporter
        # (OTEL_BSP_MAX_QUEUE_SIZE, as the SDK reads it)
        self.capacity: int = BatchSpanProcessor._default_max_queue_size()  # type: ignore[no-untyped-call]
        self.queued = 0
        self.dropped = 0

    def on_end(self, span: ReadableSpan) -> None:
        if not (span.context and span.context.trace_flags.sampled):
            return
        if self.queued - self.exporter.handed >= self.capacity:
            self.dropped += 1
            return
        self.queued += 1
        super().on_end(span)


class Tracing:
    """This process's tracer and exporter (one per app: never the global provider, so that
    tests can run several gateways in one process)."""

    def __init__(self, service_version: str) -> None:
        resource = Resource.create()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
        resource = Resource({SERVICE_VERSION: service_version}).merge(resource)
        self.exporter = _CountingExporter(OTLPSpanExporter())
        try:
            self.processor = _BoundedBatches(self.exporter)
        except ValueError as exc:  # the SDK's words on OTEL_BSP_* values that do not fit
            raise ConfigError(f"OTEL_BSP_*: {exc}") from None
        # The sampler comes from OTEL_TRACES_SAMPLER (default: parent-based, always on).
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("mcp-gateway", service_version)

    # -- requests (the tracing middleware) ----------------------------------------------------

    def parent(self, request: web.Request, body: bytes | None) -> Context | None:
        """The caller's trace context: the traceparent header, else the message's `_meta`."""
        if "traceparent" in request.headers:
            return _PROPAGATOR.extract(request.headers)
        if body and b'"traceparent"' in body:
            meta = _meta(body)
            if meta is not None:
                return _PROPAGATOR.extract(meta)
        return None

    def start(self, name: str, parent: Context | None, attributes: dict[str, Any]) -> Trace:
        span = self.tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        return Trace(span)

    @staticmethod
    def end(trace_: Trace, status: int, attributes: dict[str, Any]) -> None:
        span = trace_.span
        attributes[STATUS_CODE] = status
        span.set_attributes(attributes)
        if trace_.failed is not None:
            set_failed(span, trace_.failed)
        elif not trace_.logged and status >= 500:
            set_failed(span, str(status))
        span.end()

    # -- the upstream exchange ----------------------------------------------------------------

    def exchange(
        self, trace_: Trace, name: str, attributes: dict[str, Any], headers: Any, body: bytes
    ) -> tuple[Span, bytes]:
        """A CLIENT span for an exchange with an upstream, under the request's span. Its
        context is set in `headers` (traceparent, tracestate), and in the body's
        `_meta.traceparent` when the caller put one there; returns the span and the body."""
        span = self.tracer.start_span(
            name,
            context=trace.set_span_in_context(trace_.span),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        context = trace.set_span_in_context(span)
        _PROPAGATOR.inject(headers, context=context)
        if body and b'"traceparent"' in body:
            body = _with_traceparent(body, headers["traceparent"])
        return span, body

    @staticmethod
    def propagate(trace_: Trace, headers: Any) -> None:
        """The request's own context set in `headers` (a request not sampled: its exchange
        gets no span of its own)."""
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(trace_.span))

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        attributes: Mapping[str, Any],
        kind: SpanKind = SpanKind.CLIENT,
        headers: dict[str, str] | None = None,
    ) -> Iterator[Span]:
        """A span of the gateway's own work (a probe, a playground call, a notification):
        ERROR when the block raises; `headers` get its context (traceparent) for the request
        it makes."""
        with self.tracer.start_as_current_span(
            name, kind=kind, attributes=attributes, record_exception=False
        ) as span:
            if headers is not None:
                _PROPAGATOR.inject(headers)
            yield span

    # -- the process ---------------------------------------------------------------------------

    def readings(self) -> list[Reading]:
        """For /metrics: spans exported, and dropped (the queue was full, or the export
        failed)."""

        def counts() -> list[tuple[tuple[str, ...], float]]:
            dropped = self.processor.dropped + self.exporter.failed
            return [(("exported",), self.exporter.exported), (("dropped",), dropped)]

        return [
            Reading(
                "counter",
                "trace_spans",
                "Spans sent to the OpenTelemetry collector, by result: exported, or dropped "
                "(the export queue was full, or the collector could not be reached)",
                ("result",),
                counts,
            )
        ]

    async def close(self) -> None:
        """The spans still queued are sent (within a bound), off the event loop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(self.provider.shutdown), _SHUTDOWN_SECONDS)


def _meta(body: bytes) -> dict[str, Any] | None:
    """The `_meta` of a request's (first) message, if it has one."""
    if len(body) > _DESCRIBED_BYTES:
        return None
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(message, list):
        message = message[0] if message else None
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta if isinstance(meta, dict) else None


def _with_traceparent(body: bytes, traceparent: str) -> bytes:
    """The body with the value of its message's `_meta.traceparent` replaced by ours (of the
    same length: W3C version 00). Only when the message is one and the value found once, as
    the parsed `_meta` says: an argument that happens to look alike is never touched."""
    meta = _meta(body)
    value = None if meta is None else meta.get("traceparent")
    if not isinstance(value, str) or len(value) != len(traceparent):
        return body
    matches = [m for m in _META_TRACEPARENT.finditer(body) if m.group(1) == value.encode()]
    if len(matches) != 1:
        return body
    start, end = matches[0].span(1)
    return body[:start] + traceparent.encode() + body[end:]


# -- describing a request ------------------------------------------------------------------------


def describe(body: bytes | None) -> tuple[str | None, dict[str, Any]]:
    """A request's MCP method and attributes, from its (first) message: the tool, prompt or
    resource it names, its JSON-RPC id; and how many messages a batch holds."""
    attributes: dict[str, Any] = {}
    if not body or len(body) > _DESCRIBED_BYTES:
        return None, attributes
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, attributes
    if isinstance(message, list):
        attributes[BATCH_SIZE] = len(message)
        message = message[0] if message else None
    if not isinstance(message, dict):
        return None, attributes
    method = message.get("method")
    if not isinstance(method, str):
        return None, attributes  # a response to a server's request
    attributes[METHOD] = method
    rid = message.get("id")
    if rid is not None:
        attributes[REQUEST_ID] = str(rid)
    params = message.get("params")
    if isinstance(params, dict):
        name = params.get("name")
        if method == "tools/call" and isinstance(name, str):
            attributes[TOOL] = name
            attributes[OPERATION] = "execute_tool"
        elif method == "prompts/get" and isinstance(name, str):
            attributes[PROMPT] = name
        elif method == "resources/read" and isinstance(params.get("uri"), str):
            attributes[RESOURCE_URI] = params["uri"]
    return method, attributes


def span_name(method: str | None, attributes: Mapping[str, Any], fallback: str) -> str:
    """ "{mcp.method.name} {target}" (the MCP semantic conventions), else the fallback."""
    if method is None:
        return fallback
    target = attributes.get(TOOL) or attributes.get(PROMPT)
    return f"{method} {target}" if target else method


# -- the middleware ------------------------------------------------------------------------------

# What a traced route is: an MCP endpoint (a proxy or a toolset), or the playground's invoke.
MCP_ENDPOINT: Final = "mcp"
PLAYGROUND: Final = "playground"


def middleware(tracing: Tracing, routes: Mapping[str, str]) -> Middleware:
    """The SERVER span of each request to a traced route (`routes`: its path template, as
    aiohttp's resource.canonical, to what it is). Outermost, so that it sees the answer the
    error middleware made. Installed only while tracing is on."""
    from gateway.accounts.access import PRINCIPAL  # (accounts is above ops in the map)

    @web.middleware
    async def traced(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        what = None if resource is None else routes.get(resource.canonical)
        if what is None or resource is None:
            return await handler(request)
        body = await _arrived(request)
        parent = tracing.parent(request, body) if what == MCP_ENDPOINT else None
        route_name = f"{request.method} {resource.canonical}"
        # Described at the start when the body is at hand (most are): attributes given to a
        # span as it starts cost a third less than set later.
        name, attributes = _described(request, what, body, route_name)
        trace_ = tracing.start(name, parent, attributes)
        request[TRACE] = trace_
        token = otel_context.attach(trace.set_span_in_context(trace_.span))
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            otel_context.detach(token)
            if trace_.span.is_recording():
                late: dict[str, Any] = {}
                if body is None and (body := await _arrived(request)) is not None:
                    name, late = _described(request, what, body, route_name)
                    trace_.span.update_name(name)
                principal = request.get(PRINCIPAL)
                if principal is not None:
                    late[WORKSPACE] = str(principal.workspace_id)
                tracing.end(trace_, status, late)
            else:
                trace_.span.end()  # (not sampled: nothing more to say)

    return traced


def _described(
    request: web.Request, what: str, body: bytes | None, route_name: str
) -> tuple[str, dict[str, Any]]:
    """The SERVER span's name, after the request's message, and its attributes."""
    if what == MCP_ENDPOINT:
        method, attributes = describe(body)
    else:
        method, attributes = _playground_call(body)
    info = request.match_info
    for name, key in (("server_id", SERVER), ("toolset_id", TOOLSET)):
        if name in info:
            attributes[key] = info[name]
    for header, key in (("Mcp-Session-Id", SESSION), ("MCP-Protocol-Version", PROTOCOL)):
        value = request.headers.get(header)
        if value is not None:
            attributes[key] = value
    return span_name(method, attributes, route_name), attributes


async def _arrived(request: web.Request) -> bytes | None:
    """The request's body if it has arrived whole already (most do, with their headers): read
    now, or as the handler read it (aiohttp keeps it). A body still on its way is left to the
    handler, which bounds how long it may take."""
    length = request.content_length
    if length is None or not request.content.is_eof():
        return None  # (a chunked body is left alone too: its size is known only once read)
    if length > request.app[SETTINGS].max_body_bytes:
        return None  # the handler refuses it (413)
    return await request.read()


def _playground_call(body: bytes | None) -> tuple[str | None, dict[str, Any]]:
    """A playground invoke is a tools/call of `tool_name` (in the API's JSON body, or the
    dashboard's form)."""
    tool: Any = None
    if body and len(body) <= _DESCRIBED_BYTES:
        if body.lstrip().startswith(b"{"):
            try:
                tool = orjson.loads(body).get("tool_name")
            except orjson.JSONDecodeError:
                tool = None
        else:
            tool = next(iter(parse_qs(body.decode(errors="replace")).get("tool_name", ())), None)
    if not isinstance(tool, str):
        return None, {}
    return "tools/call", {METHOD: "tools/call", TOOL: tool, OPERATION: "execute_tool"}


TRACING: web.AppKey[Tracing | None] = web.AppKey("tracing")
