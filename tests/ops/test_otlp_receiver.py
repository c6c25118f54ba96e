"""The test collector (tests/helpers/otlp.py) against real exporters: the OTel SDK's OTLP/HTTP
exporter in this process, and the official MCP SDK server's spans from its own process."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from tests.helpers.otlp import Collector, ReceivedSpan, traceparent, tracing_env
from tests.helpers.upstreams import sdk_server

ProviderFactory = Callable[..., TracerProvider]


@pytest.fixture
async def make_provider() -> AsyncIterator[ProviderFactory]:
    """TracerProviders of the test's own (never the global one), exporting over OTLP/HTTP;
    `exporter` arguments go to OTLPSpanExporter, which otherwise reads the environment."""
    providers: list[TracerProvider] = []

    def make(service: str = "otlp-test", **exporter: Any) -> TracerProvider:
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        processor = BatchSpanProcessor(OTLPSpanExporter(**exporter), schedule_delay_millis=50)
        provider.add_span_processor(processor)
        providers.append(provider)
        return provider

    yield make
    for provider in providers:
        await asyncio.to_thread(provider.shutdown)


def named(name: str) -> Callable[[ReceivedSpan], bool]:
    return lambda span: span.name == name


async def flush(provider: TracerProvider) -> None:
    # Blocks until the batch is exported (or the export has failed): off the event loop.
    assert await asyncio.to_thread(provider.force_flush)


async def test_spans_arrive_decoded_with_their_parent_kind_attributes_and_status(
    collector: Collector, make_provider: ProviderFactory
) -> None:
    provider = make_provider("gateway-under-test", endpoint=f"{collector.endpoint}/v1/traces")
    tracer = provider.get_tracer("tests.ops")
    with tracer.start_as_current_span("POST /mcp", kind=SpanKind.SERVER) as server:
        server.set_attributes({"http.response.status_code": 502, "mcp.server": "files"})
        with tracer.start_as_current_span("tools/call read", kind=SpanKind.CLIENT) as client:
            client.set_attributes({"retried": True, "ratio": 0.25, "tools": ("read", "write")})
            client.set_status(Status(StatusCode.ERROR, "upstream refused"))
            client.add_event("exception")
    await flush(provider)

    received = {span.name: span for span in await collector.spans_where(at_least=2)}
    assert received.keys() == {"POST /mcp", "tools/call read"}
    outer, inner = received["POST /mcp"], received["tools/call read"]
    context = server.get_span_context()
    assert outer.trace_id == inner.trace_id == f"{context.trace_id:032x}"
    assert outer.span_id == f"{context.span_id:016x}"
    assert outer.parent_span_id is None
    assert inner.parent_span_id == outer.span_id
    assert (outer.kind, inner.kind) == ("SERVER", "CLIENT")
    assert outer.attributes == {"http.response.status_code": 502, "mcp.server": "files"}
    assert inner.attributes == {"retried": True, "ratio": 0.25, "tools": ["read", "write"]}
    assert (outer.status, outer.status_message) == ("UNSET", "")
    assert (inner.status, inner.status_message) == ("ERROR", "upstream refused")
    assert inner.events == ("exception",)
    assert {outer.service_name, inner.service_name} == {"gateway-under-test"}
    assert {outer.scope_name, inner.scope_name} == {"tests.ops"}
    assert collector.encodings == ["identity"]


async def test_tracing_env_points_an_exporter_at_the_collector_gzip_included(
    collector: Collector,
    make_provider: ProviderFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracing_env(monkeypatch, collector.endpoint, OTEL_EXPORTER_OTLP_COMPRESSION="gzip")
    provider = make_provider()  # endpoint, compression and timeout from the environment
    with provider.get_tracer("tests.ops").start_as_current_span("compressed"):
        pass
    (span,) = await collector.spans_where(named("compressed"))
    assert span.kind == "INTERNAL"
    assert collector.encodings == ["gzip"]


async def test_a_stopped_collector_refuses_exports_and_a_restarted_one_takes_them(
    collector: Collector, make_provider: ProviderFactory
) -> None:
    provider = make_provider(
        endpoint=f"{collector.endpoint}/v1/traces", timeout=2, compression=Compression.Gzip
    )
    tracer = provider.get_tracer("tests.ops")
    await collector.stop()
    with tracer.start_as_current_span("while stopped"):
        pass
    await flush(provider)  # returns once the exporter has given up (2 s at most)
    await collector.restart()
    with tracer.start_as_current_span("after restart"):
        pass
    await flush(provider)
    await collector.spans_where(named("after restart"))
    assert [span.name for span in collector.spans] == ["after restart"]
    assert collector.encodings == ["gzip"]  # the export while stopped never arrived


async def test_a_hanging_collector_takes_requests_without_answering_and_still_stops(
    collector: Collector, make_provider: ProviderFactory
) -> None:
    provider = make_provider(endpoint=f"{collector.endpoint}/v1/traces", timeout=1)
    tracer = provider.get_tracer("tests.ops")
    collector.hang = True
    with tracer.start_as_current_span("unanswered"):
        pass
    await flush(provider)  # the exporter times out (1 s)
    assert collector.encodings  # the request came in
    assert collector.spans == []
    await collector.stop()  # with requests still hanging
    collector.hang = False
    await collector.start()
    with tracer.start_as_current_span("answered"):
        pass
    await collector.spans_where(named("answered"))


async def test_the_sdk_server_parents_its_span_on_meta_and_reports_the_headers(
    collector: Collector,
) -> None:
    """The official MCP SDK server makes a SERVER span per message, parented by the
    traceparent in `params._meta`, not by the HTTP header (trace_headers reports that)."""
    header = traceparent(secrets.token_hex(16), secrets.token_hex(8))
    meta_trace, meta_span = secrets.token_hex(16), secrets.token_hex(8)
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "trace_headers",
            "arguments": {},
            "_meta": {"traceparent": traceparent(meta_trace, meta_span)},
        },
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
        "traceparent": header,
        "tracestate": "gw=1",
    }
    with sdk_server(stateless=True, json_response=True, otlp_endpoint=collector.endpoint) as url:
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, json=call, headers=headers) as response,
        ):
            assert response.status == 200, await response.text()
            reply = await response.json()
        assert not reply["result"].get("isError"), reply
        reported = json.loads(reply["result"]["content"][0]["text"])
        assert reported == {"traceparent": header, "tracestate": "gw=1"}

        (span,) = await collector.spans_where(lambda span: span.trace_id == meta_trace)
    assert span.parent_span_id == meta_span
    assert (span.name, span.kind, span.status) == ("tools/call trace_headers", "SERVER", "UNSET")
    assert (span.service_name, span.scope_name) == ("sdk-test-upstream", "mcp-python-sdk")
    assert span.attributes["mcp.method.name"] == "tools/call"
    assert span.attributes["gen_ai.tool.name"] == "trace_headers"
