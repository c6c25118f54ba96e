"""Traces (OpenTelemetry): each proxied or toolset request is a SERVER span continuing the
caller's trace, its upstream exchange a CLIENT span whose context reaches the upstream, with
the MCP attributes, ERROR exactly when a call is logged `error`, and the trace id on each row.
Spans are received by a real OTLP/HTTP collector on loopback and decoded with
opentelemetry-proto; the upstreams are the official SDK's servers, themselves traced."""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

import asyncpg
import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import use_span

from gateway.app import create_app
from gateway.config import ConfigError, Settings
from tests.helpers.api import Api
from tests.helpers.otlp import (
    Collector,
    ReceivedSpan,
    parse_traceparent,
    traceparent,
    tracing_env,
)
from tests.helpers.proxying import (
    ACCEPT,
    AppFactory,
    Setup,
    arrange,
    call,
    logged_calls,
    recorder,
    rpc,
    sdk_client,
)
from tests.helpers.toolsets import arrange_toolset, prefix
from tests.helpers.toolsets import post as toolset_post
from tests.helpers.upstreams import unused_url
from tests.helpers.waiting import eventually

# What a 2026-07-28 request carries in params._meta instead of a handshake.
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def new_ids() -> tuple[str, str]:
    return secrets.token_hex(16), secrets.token_hex(8)


async def post(
    setup: Setup, message: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    response = await setup.api.client.post(
        f"/api/v1{setup.path}",
        data=orjson.dumps(message),
        headers={
            "X-API-Key": setup.key,
            "Accept": ACCEPT,
            "Content-Type": "application/json",
            **(headers or {}),
        },
    )
    raw = await response.read()
    return response.status, orjson.loads(raw) if raw else None


def only(spans: list[ReceivedSpan], **wanted: Any) -> ReceivedSpan:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in wanted.items())]
    assert len(found) == 1, (wanted, spans)
    return found[0]


async def trace_of(collector: Collector, trace_id: str, at_least: int) -> list[ReceivedSpan]:
    return await collector.spans_where(lambda s: s.trace_id == trace_id, at_least=at_least)


# -- one call, end to end ------------------------------------------------------------------------


async def test_a_call_continues_the_callers_trace_through_the_gateway_to_the_sdk_server(
    traced_api: Api, db: asyncpg.Connection, collector: Collector, traced_upstream: str
) -> None:
    """The caller's traceparent (header and `_meta`, as an instrumented SDK client sends it)
    is the SERVER span's parent; the CLIENT span is its child, and its context is what the
    upstream receives: in the header, and in `_meta`, where the SDK server reads it, so the
    server's own span hangs under the gateway's exchange."""
    setup = await arrange(traced_api, db, traced_upstream)
    trace_id, caller_span = new_ids()
    parent = traceparent(trace_id, caller_span)
    message = call("trace_headers", rid=7)
    message["params"]["_meta"] = {"traceparent": parent}
    status, body = await post(
        setup,
        message,
        {"traceparent": parent, "MCP-Protocol-Version": "2025-06-18", "X-Caller-Agent": "agent"},
    )
    assert status == 200, body
    received = json.loads(body["result"]["content"][0]["text"])

    spans = await trace_of(collector, trace_id, at_least=3)
    server = only(spans, kind="SERVER", service_name="mcp-gateway")
    client = only(spans, kind="CLIENT", service_name="mcp-gateway")
    upstream = only(spans, service_name="sdk-test-upstream")
    assert server.parent_span_id == caller_span
    assert client.parent_span_id == server.span_id
    assert upstream.parent_span_id == client.span_id
    assert parse_traceparent(received["traceparent"]) == (trace_id, client.span_id)

    assert server.name == client.name == "tools/call trace_headers"
    assert server.attributes == {
        "mcp.method.name": "tools/call",
        "gen_ai.tool.name": "trace_headers",
        "gen_ai.operation.name": "execute_tool",
        "jsonrpc.request.id": "7",
        "mcp.protocol.version": "2025-06-18",
        "mcp_gateway.server.id": setup.server_id,
        "mcp_gateway.workspace.id": setup.owner.workspace_id,
        "http.response.status_code": 200,
    }
    assert client.attributes["server.address"] == "127.0.0.1"
    assert client.attributes["http.response.status_code"] == 200
    assert client.attributes["mcp_gateway.server.id"] == setup.server_id
    assert server.status == client.status == "UNSET"

    [row] = await logged_calls(db, 1)
    assert (row["tool_name"], row["status"], row["trace_id"]) == (
        "trace_headers",
        "success",
        trace_id,
    )


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_sdk_client_inside_a_trace_is_continued_by_its_meta(
    traced_api: Api,
    db: asyncpg.Connection,
    collector: Collector,
    traced_upstream: str,
    mode: str,
) -> None:
    """The official SDK client puts the current trace context in each request's `_meta` (no
    header): the gateway continues it, in both protocol eras."""
    setup = await arrange(traced_api, db, traced_upstream)
    agent = TracerProvider().get_tracer("agent").start_span("agent turn")
    agent_context = agent.get_span_context()
    trace_id, agent_span = (
        format(agent_context.trace_id, "032x"),
        format(agent_context.span_id, "016x"),
    )
    async with sdk_client(setup.url, setup.key, mode) as client:
        with use_span(agent, end_on_exit=True):
            result = await client.call_tool("trace_headers", {})
    received = json.loads(result.content[0].text)  # type: ignore[union-attr]

    spans = await collector.spans_where(
        lambda s: s.trace_id == trace_id and s.name == "tools/call trace_headers", at_least=3
    )
    server = only(spans, kind="SERVER", service_name="mcp-gateway")
    client_span = only(spans, kind="CLIENT", service_name="mcp-gateway")
    upstream = only(spans, service_name="sdk-test-upstream")
    assert server.parent_span_id == agent_span
    assert client_span.parent_span_id == server.span_id
    assert upstream.parent_span_id == client_span.span_id
    assert parse_traceparent(received["traceparent"]) == (trace_id, client_span.span_id)
    rows = await logged_calls(db, 1)
    assert rows[-1]["trace_id"] == trace_id


async def test_without_a_callers_trace_the_gateway_starts_one(
    traced_api: Api, db: asyncpg.Connection, collector: Collector, sdk_json_url: str
) -> None:
    setup = await arrange(traced_api, db, sdk_json_url)
    status, _ = await post(setup, call("echo", text="hi"))
    assert status == 200
    [row] = await logged_calls(db, 1)
    spans = await trace_of(collector, row["trace_id"], at_least=2)
    server = only(spans, kind="SERVER")
    assert server.parent_span_id is None
    assert only(spans, kind="CLIENT").parent_span_id == server.span_id


# -- status: ERROR exactly when a call is logged `error` -----------------------------------------


async def test_the_span_is_an_error_exactly_when_the_call_is_logged_one(
    traced_api: Api, db: asyncpg.Connection, collector: Collector, sdk_json_url: str
) -> None:
    setup = await arrange(traced_api, db, sdk_json_url)
    outcomes: dict[str, str] = {}
    for name, message in (
        ("ok", call("echo", text="fine")),
        ("is_error", call("fail")),
        ("bad_arguments", call("add", a="x", b=1)),
        ("list", rpc("tools/list")),
    ):
        trace_id, caller = new_ids()
        status, _ = await post(setup, message, {"traceparent": traceparent(trace_id, caller)})
        assert status == 200
        outcomes[name] = trace_id

    rows = {row["trace_id"]: row for row in await logged_calls(db, 3)}
    for name in ("ok", "is_error", "bad_arguments"):
        spans = await trace_of(collector, outcomes[name], at_least=2)
        server = only(spans, kind="SERVER")
        row = rows[outcomes[name]]
        assert (server.status == "ERROR") == (row["status"] == "error"), name
        if row["status"] == "error":
            assert server.attributes["error.type"] == "tool_error"
        else:
            assert "error.type" not in server.attributes
    listing = await trace_of(collector, outcomes["list"], at_least=2)
    assert only(listing, kind="SERVER").name == "tools/list"
    assert only(listing, kind="SERVER").status == "UNSET"
    assert outcomes["list"] not in rows


async def test_an_unreachable_server_errs_both_spans(
    traced_api: Api, db: asyncpg.Connection, collector: Collector
) -> None:
    setup = await arrange(traced_api, db, unused_url())
    trace_id, caller = new_ids()
    status, _ = await post(setup, call("echo"), {"traceparent": traceparent(trace_id, caller)})
    assert status == 502
    spans = await trace_of(collector, trace_id, at_least=2)
    server, client = only(spans, kind="SERVER"), only(spans, kind="CLIENT")
    assert (server.status, server.attributes["error.type"]) == ("ERROR", "unreachable")
    assert server.attributes["http.response.status_code"] == 502
    assert (client.status, client.attributes["error.type"]) == ("ERROR", "unreachable")
    [row] = await logged_calls(db, 1)
    assert (row["status"], row["trace_id"]) == ("error", trace_id)


async def test_a_refused_call_is_an_error_span_with_no_exchange(
    traced_api: Api, db: asyncpg.Connection, collector: Collector, sdk_json_url: str
) -> None:
    setup = await arrange(traced_api, db, sdk_json_url)
    await traced_api.patch(
        f"/servers/{setup.server_id}",
        json={"disabled_tools": ["fail"]},
        auth=setup.owner,
        expect=200,
    )
    trace_id, caller = new_ids()
    status, body = await post(setup, call("fail"), {"traceparent": traceparent(trace_id, caller)})
    assert (status, body["error"]["code"]) == (403, -32003)
    spans = await trace_of(collector, trace_id, at_least=1)
    server = only(spans, kind="SERVER")
    assert (server.status, server.attributes["error.type"]) == ("ERROR", "refused")
    assert not [s for s in spans if s.kind == "CLIENT"]
    [row] = await logged_calls(db, 1)
    assert row["error_message"].startswith("refused:") and row["trace_id"] == trace_id


async def test_a_request_that_logs_no_call_is_an_error_when_answered_5xx(
    traced_api: Api, db: asyncpg.Connection, collector: Collector
) -> None:
    async with recorder(status=503) as upstream:
        setup = await arrange(traced_api, db, upstream.url)
        trace_id, caller = new_ids()
        status, _ = await post(
            setup, rpc("tools/list"), {"traceparent": traceparent(trace_id, caller)}
        )
    assert status == 503
    spans = await trace_of(collector, trace_id, at_least=2)
    server, client = only(spans, kind="SERVER"), only(spans, kind="CLIENT")
    assert (server.status, server.attributes["error.type"]) == ("ERROR", "503")
    assert (client.status, client.attributes["http.response.status_code"]) == ("ERROR", 503)


# -- batches, toolsets, what passes unchanged -----------------------------------------------------


async def test_a_batch_is_one_span_and_its_calls_share_its_trace(
    traced_api: Api, db: asyncpg.Connection, collector: Collector, sdk_json_url: str
) -> None:
    setup = await arrange(traced_api, db, sdk_json_url)
    trace_id, caller = new_ids()
    batch = [call("echo", rid=1, text="a"), call("fail", rid=2)]
    async with recorder() as upstream:  # (the SDK server takes no batches: a recorder does)
        setup = await arrange(traced_api, db, upstream.url)
        status, _ = await post(setup, batch, {"traceparent": traceparent(trace_id, caller)})
        sent_body = upstream.requests[-1][2]
    assert status == 200
    assert sent_body == orjson.dumps(batch)  # no `_meta` in it: byte for byte
    spans = await trace_of(collector, trace_id, at_least=2)
    server = only(spans, kind="SERVER")
    assert server.attributes["mcp_gateway.batch.size"] == 2
    assert server.name == "tools/call echo"
    rows = await logged_calls(db, 2)
    assert [r["trace_id"] for r in rows] == [trace_id, trace_id]


async def test_the_body_is_forwarded_unchanged_but_for_the_meta_traceparent(
    traced_api: Api, db: asyncpg.Connection, collector: Collector
) -> None:
    """Only the value of `_meta.traceparent` changes (same length); an argument that happens to
    hold the same text is left alone."""
    trace_id, caller = new_ids()
    parent = traceparent(trace_id, caller)
    raw = (
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo",'
        b'"arguments":{"text":"'
        + parent.encode()
        + b'"},"_meta":{ "traceparent" : "'
        + parent.encode()
        + b'"}}}'
    )
    async with recorder() as upstream:
        setup = await arrange(traced_api, db, upstream.url)
        response = await setup.api.client.post(
            f"/api/v1{setup.path}",
            data=raw,
            headers={"X-API-Key": setup.key, "Accept": ACCEPT, "Content-Type": "application/json"},
        )
        assert response.status == 200
        _, headers, sent = upstream.requests[-1]
    spans = await trace_of(collector, trace_id, at_least=2)
    client = only(spans, kind="CLIENT")
    ours = traceparent(trace_id, client.span_id)
    assert headers["traceparent"] == ours
    assert sent == raw.replace(b'"' + parent.encode() + b'"}}}', b'"' + ours.encode() + b'"}}}')
    assert len(sent) == len(raw)


async def test_a_toolset_call_is_traced_to_its_member(
    traced_api: Api, db: asyncpg.Connection, collector: Collector, traced_upstream: str
) -> None:
    toolset = await arrange_toolset(traced_api, db, [traced_upstream])
    trace_id, caller = new_ids()
    name = prefix(toolset.names[0]) + "trace_headers"
    message = call(name, rid=4)
    message["params"]["_meta"] = ENVELOPE
    status, body, _ = await toolset_post(
        toolset,
        toolset.key,
        message,
        traceparent=traceparent(trace_id, caller),
        **{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": name},
    )
    assert status == 200, body
    received = json.loads(body["result"]["content"][0]["text"])
    spans = await trace_of(collector, trace_id, at_least=2)
    server, client = only(spans, kind="SERVER"), only(spans, kind="CLIENT")
    assert server.name == f"tools/call {name}"
    assert server.attributes["mcp_gateway.toolset.id"] == toolset.toolset_id
    assert server.parent_span_id == caller and client.parent_span_id == server.span_id
    assert client.name == "tools/call trace_headers"  # the member's own name for it
    assert client.attributes["mcp_gateway.server.id"] == toolset.servers[0]
    assert parse_traceparent(received["traceparent"]) == (trace_id, client.span_id)
    rows = await logged_calls(db, 1)
    assert (rows[-1]["trace_id"], str(rows[-1]["toolset_id"])) == (trace_id, toolset.toolset_id)


# -- off, unsampled ------------------------------------------------------------------------------


async def test_off_the_callers_traceparent_passes_unchanged_and_rows_hold_none(
    api: Api, db: asyncpg.Connection
) -> None:
    parent = traceparent(*new_ids())
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        status, _ = await post(setup, call("echo"), {"traceparent": parent})
        assert status == 200
        assert upstream.last_headers["traceparent"] == parent
    [row] = await logged_calls(db, 1)
    assert row["trace_id"] is None
    metrics = await api.client.get("/api/v1/metrics")
    assert "mcp_gateway_trace_spans" not in await metrics.text()


async def test_an_unsampled_call_is_neither_exported_nor_linked(
    make_api: AppFactory,
    db: asyncpg.Connection,
    collector: Collector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracing_env(monkeypatch, collector.endpoint, OTEL_TRACES_SAMPLER="always_off")
    api = await make_api(tracing=True)
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        status, _ = await post(setup, call("echo"))
        assert status == 200
        # The context still goes upstream, marked not sampled (flag 01 unset).
        flags = upstream.last_headers["traceparent"].rsplit("-", 1)[1]
        assert int(flags, 16) & 1 == 0
    [row] = await logged_calls(db, 1)
    assert row["trace_id"] is None
    await asyncio.sleep(0.3)  # several export intervals (50 ms)
    assert collector.spans == []


# -- a collector that goes away --------------------------------------------------------------------


async def spans_counted(api: Api) -> dict[str, float]:
    text = await (await api.client.get("/api/v1/metrics")).text()
    counted = {}
    for line in text.splitlines():
        if line.startswith("mcp_gateway_trace_spans_total{"):
            result = line.split('result="')[1].split('"')[0]
            counted[result] = float(line.rsplit(" ", 1)[1])
    return counted


async def test_a_collector_that_stops_or_hangs_mid_load_loses_no_call(
    make_api: AppFactory,
    db: asyncpg.Connection,
    collector: Collector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Calls go on while the collector hangs (exports wait on it in their own thread: the
    queue fills and spans are dropped) and after it is gone (exports fail): every call is
    answered and logged with its trace id, and the lost spans are counted in /metrics."""
    tracing_env(
        monkeypatch,
        collector.endpoint,
        OTEL_BSP_MAX_QUEUE_SIZE="64",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="32",
    )
    api = await make_api(tracing=True)
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)

        async def calls(first: int, count: int, exported: bool = False) -> None:
            for start in range(first, first + count, 20):
                batch = [post(setup, call("echo", rid=i, n=i)) for i in range(start, start + 20)]
                assert [status for status, _ in await asyncio.gather(*batch)] == [200] * 20
                if exported:  # each batch's 40 spans taken before the next (a queue of 64)
                    clients = start + 20
                    await collector.spans_where(lambda s: s.kind == "CLIENT", at_least=clients)

        await calls(0, 100, exported=True)
        collector.hang = True
        await calls(100, 200)
        await collector.stop()
        await calls(300, 100)

    rows = await logged_calls(db, 400, within=20)
    assert len({row["trace_id"] for row in rows}) == 400
    assert all(row["status"] == "success" for row in rows)

    async def dropped() -> bool:
        return (await spans_counted(api)).get("dropped", 0) > 0

    await eventually(dropped, within=15)
    counted = await spans_counted(api)
    assert counted["exported"] >= 200  # the first 100 calls' SERVER and CLIENT spans
    assert counted["exported"] + counted["dropped"] <= 800


def test_batch_settings_the_sdk_refuses_are_a_configuration_error(
    settings: Settings, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracing_env(
        monkeypatch,
        collector.endpoint,
        OTEL_BSP_MAX_QUEUE_SIZE="10",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="100",
    )
    with pytest.raises(ConfigError, match="OTEL_BSP_"):
        create_app(settings.replace(tracing=True))
