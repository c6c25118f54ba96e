"""A loopback OTLP/HTTP trace collector for tests: keeps the spans a process exports to it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.helpers.api import Api, AppFactory
from tests.helpers.upstreams import sdk_server
from tests.helpers.waiting import until

PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    """One span as the collector decoded it; ids in lowercase hex, enums by their short name."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str  # SERVER, CLIENT, INTERNAL, PRODUCER, CONSUMER
    attributes: dict[str, Any]
    status: str  # UNSET, OK, ERROR
    status_message: str
    service_name: str
    scope_name: str
    events: tuple[str, ...]  # event names, e.g. "exception"


class Collector:
    """POST /v1/traces on 127.0.0.1, answered like a real collector (200 and an empty
    ExportTraceServiceResponse); `hang` makes it accept requests and never answer them.

    `endpoint` is the value for OTEL_EXPORTER_OTLP_ENDPOINT. After `stop()` nothing listens,
    so exports fail with "connection refused"; `restart()` listens on the same port again.

    It serves from an event loop in a thread of its own: exporters flush synchronously (a
    provider's shutdown, a process stopped from a sync fixture), and a collector sharing the
    blocked loop could not answer them.
    """

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        # Content-Encoding of each export request received ("identity" when none), hung
        # ones included.
        self.encodings: list[str] = []
        self.hang = False
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        assert self.port, "the collector has not started"
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        assert self._loop is None, "the collector is running"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="otlp-collector", daemon=True
        )
        self._thread.start()
        await self._in_thread(self._listen())

    async def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        await self._in_thread(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join)
        self._loop.close()
        self._loop = self._thread = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def _in_thread(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _listen(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        # A short grace on stop: hung requests are then cancelled, their connections dropped.
        self._runner = web.AppRunner(app, shutdown_timeout=0.1, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self.port = self._runner.addresses[0][1]

    async def _close(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()
        self._runner = None

    async def spans_where(
        self,
        predicate: Callable[[ReceivedSpan], bool] = lambda span: True,
        *,
        at_least: int = 1,
        within: float = 10.0,
    ) -> list[ReceivedSpan]:
        """The spans matching `predicate`, once at least `at_least` of them have arrived."""

        def matching() -> list[ReceivedSpan]:
            return [span for span in self.spans if predicate(span)]

        try:
            await until(lambda: len(matching()) >= at_least, within)
        except AssertionError:
            got = "\n".join(f"  {span}" for span in self.spans) or "  nothing"
            message = f"fewer than {at_least} matching spans within {within} s; received:\n{got}"
            raise AssertionError(message) from None
        return matching()

    async def _export(self, request: web.Request) -> web.Response:
        encoding = request.headers.get("Content-Encoding", "identity").lower()
        self.encodings.append(encoding)
        if self.hang:
            await asyncio.Event().wait()  # until stop() cancels it
        # aiohttp has already undone a gzip or deflate Content-Encoding.
        try:
            export = ExportTraceServiceRequest.FromString(await request.read())
        except DecodeError as exc:
            return web.json_response({"detail": f"not an export request: {exc}"}, status=400)
        self.spans.extend(decode(export))
        reply = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=reply, content_type=PROTOBUF)


def decode(export: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    spans = []
    for resource_spans in export.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        name=span.name,
                        kind=Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                        attributes=attributes_of(span.attributes),
                        status=Status.StatusCode.Name(span.status.code).removeprefix(
                            "STATUS_CODE_"
                        ),
                        status_message=span.status.message,
                        service_name=str(resource.get("service.name", "")),
                        scope_name=scope_spans.scope.name,
                        events=tuple(event.name for event in span.events),
                    )
                )
    return spans


def attributes_of(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {pair.key: value_of(pair.value) for pair in pairs}


def value_of(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def traceparent(trace_id: str, span_id: str) -> str:
    """A W3C traceparent header value for a sampled span."""
    return f"00-{trace_id}-{span_id}-01"


def parse_traceparent(value: str) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C traceparent header value."""
    version, trace_id, span_id, flags = value.split("-")
    assert (len(version), len(trace_id), len(span_id), len(flags)) == (2, 32, 16, 2), value
    return trace_id, span_id


def tracing_env(monkeypatch: pytest.MonkeyPatch, endpoint: str, **extra: str) -> None:
    """Point the OTel SDK of this process at `endpoint` (a Collector's) before the app is
    created, exporting every 50 ms rather than every 5 s, and with no tracing setting of the
    caller's environment left over; `extra` sets more variables (OTEL_SERVICE_NAME=...)."""
    for name in (
        "OTEL_SDK_DISABLED",
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_TRACES_EXPORTER",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
        "OTEL_PROPAGATORS",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    # Seconds in the Python SDK (milliseconds in the specification): a stopped or stuck
    # collector then holds the exporting thread, and a shutdown's final flush, for 2 s at most.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    for name, value in extra.items():
        monkeypatch.setenv(name, value)


# The tests' `collector` fixture (a plugin of the root conftest): a started Collector.
@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    started = Collector()
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


# An SDK server exporting its own spans to the test's collector (its OpenTelemetry middleware
# parents them on the message's `_meta.traceparent`), with the `trace_headers` tool.
@pytest.fixture
def traced_upstream(collector: Collector) -> Iterator[str]:
    with sdk_server(stateless=True, json_response=True, otlp_endpoint=collector.endpoint) as url:
        yield url


# A gateway whose traces go to the test's collector.
@pytest.fixture
async def traced_api(
    make_api: AppFactory, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> Api:
    tracing_env(monkeypatch, collector.endpoint)
    return await make_api(tracing=True)
