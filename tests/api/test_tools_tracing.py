"""Traces of the tool playground: each invoke is a SERVER span, its call to the server a
CLIENT span under it whose context reaches the server, ERROR exactly when the row is `error`
(refusals included), and the row keeps the trace id. Spans are received by a real OTLP/HTTP
collector on loopback; the upstream is the official SDK's server, itself traced."""

from __future__ import annotations

import json
from typing import Any

from tests.helpers.alerting import add_server
from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.browser import Browser
from tests.helpers.otlp import Collector, ReceivedSpan, parse_traceparent
from tests.helpers.upstreams import unused_url


async def invoke(
    api: Api, owner: Account, server_id: str, tool: str, expect: int = 200, **arguments: Any
) -> dict[str, Any]:
    reply = await api.post(
        f"/servers/{server_id}/tools/invoke",
        json={"tool_name": tool, "arguments": arguments},
        auth=owner,
        expect=expect,
    )
    body: dict[str, Any] = reply.body
    return body


async def row_of(api: Api, owner: Account, server_id: str) -> dict[str, Any]:
    reply = await api.get("/tool-calls", params={"server_id": server_id}, auth=owner, expect=200)
    [row] = reply.body["items"]
    item: dict[str, Any] = row
    return item


async def the_server_span(collector: Collector, trace_id: str) -> ReceivedSpan:
    [span] = await collector.spans_where(
        lambda s: s.trace_id == trace_id and s.kind == "SERVER" and s.service_name == "mcp-gateway"
    )
    return span


async def test_an_invoke_is_a_server_span_whose_client_child_reaches_the_server(
    traced_api: Api, collector: Collector, traced_upstream: str
) -> None:
    owner = await traced_api.signup()
    server_id = await add_server(traced_api, owner, "traced", traced_upstream)
    answer = await invoke(traced_api, owner, server_id, "trace_headers")
    assert answer["status"] == "success", answer
    row = await row_of(traced_api, owner, server_id)
    assert row["id"] == answer["tool_call_id"]
    trace_id = row["trace_id"]
    assert trace_id is not None and len(trace_id) == 32

    server = await the_server_span(collector, trace_id)
    [client] = await collector.spans_where(lambda s: s.trace_id == trace_id and s.kind == "CLIENT")
    assert server.parent_span_id is None  # the playground starts a trace of its own
    assert (server.name, server.status) == ("tools/call trace_headers", "UNSET")
    assert server.attributes["mcp.method.name"] == "tools/call"
    assert server.attributes["gen_ai.tool.name"] == "trace_headers"
    assert server.attributes["mcp_gateway.server.id"] == server_id
    assert server.attributes["http.response.status_code"] == 200
    assert "error.type" not in server.attributes

    assert client.parent_span_id == server.span_id
    assert (client.name, client.status) == ("tools/call trace_headers", "UNSET")
    assert client.attributes["gen_ai.operation.name"] == "execute_tool"
    assert client.attributes["mcp_gateway.server.id"] == server_id
    assert client.attributes["server.address"] == "127.0.0.1"
    assert isinstance(client.attributes["server.port"], int)

    # The server got the CLIENT span's context in the header, and in `_meta`, where the SDK
    # reads it: its own span hangs under the gateway's call.
    reported = json.loads(answer["result"]["content"][0]["text"])
    assert parse_traceparent(reported["traceparent"]) == (trace_id, client.span_id)
    [upstream] = await collector.spans_where(
        lambda s: s.trace_id == trace_id and s.service_name == "sdk-test-upstream"
    )
    assert upstream.parent_span_id == client.span_id


async def test_a_failing_tool_makes_both_spans_error(
    traced_api: Api, collector: Collector, traced_upstream: str
) -> None:
    owner = await traced_api.signup()
    server_id = await add_server(traced_api, owner, "traced", traced_upstream)
    answer = await invoke(traced_api, owner, server_id, "fail")
    assert answer["status"] == "error"
    row = await row_of(traced_api, owner, server_id)
    assert row["status"] == "error" and row["trace_id"] is not None

    server = await the_server_span(collector, row["trace_id"])
    [client] = await collector.spans_where(
        lambda s: s.trace_id == row["trace_id"] and s.kind == "CLIENT"
    )
    assert (server.status, server.attributes["error.type"]) == ("ERROR", "tool_error")
    assert (client.status, client.attributes["error.type"]) == ("ERROR", "tool_error")
    assert client.status_message == answer["error_message"]
    assert server.attributes["http.response.status_code"] == 200  # the answer says `error`


async def test_a_server_that_cannot_be_reached_is_an_error_span(
    traced_api: Api, collector: Collector
) -> None:
    """Its tool list cannot be read, so nothing is called: no CLIENT span, and the row (and
    so the SERVER span) is an error."""
    owner = await traced_api.signup()
    server_id = await add_server(traced_api, owner, "gone", unused_url())
    answer = await invoke(traced_api, owner, server_id, "echo", text="hi")
    assert answer["status"] == "error"
    row = await row_of(traced_api, owner, server_id)
    server = await the_server_span(collector, row["trace_id"])
    assert (server.status, server.attributes["error.type"]) == ("ERROR", "tool_list")
    assert [s for s in collector.spans if s.trace_id == row["trace_id"]] == [server]


async def test_a_refusal_is_logged_in_the_trace_and_makes_it_error(
    traced_api: Api, collector: Collector, traced_upstream: str
) -> None:
    owner = await traced_api.signup()
    server = await traced_api.post(
        "/servers",
        json={"name": "ruled", "url": traced_upstream, "disabled_tools": ["ec*"]},
        auth=owner,
        expect=201,
    )
    server_id = server.body["id"]
    await invoke(traced_api, owner, server_id, "echo", expect=403, text="x")
    row = await row_of(traced_api, owner, server_id)
    assert row["error_message"].startswith("refused:")
    span = await the_server_span(collector, row["trace_id"])
    assert (span.name, span.status) == ("tools/call echo", "ERROR")
    assert span.attributes["error.type"] == "refused"
    assert span.attributes["http.response.status_code"] == 403


async def test_the_dashboards_playground_form_is_traced_the_same_way(
    traced_api: Api, collector: Collector, traced_upstream: str
) -> None:
    owner = await traced_api.signup()
    server_id = await add_server(traced_api, owner, "traced", traced_upstream)
    browser = Browser(traced_api)
    try:
        await browser.log_in(owner.email)
        await browser.get(f"/servers/{server_id}/tools")
        page = await browser.post(
            f"/servers/{server_id}/tools/invoke",
            {"tool_name": "trace_headers", "arguments": "{}"},
            expect=200,
        )
    finally:
        await browser.close()
    row = await row_of(traced_api, owner, server_id)
    server = await the_server_span(collector, row["trace_id"])
    [client] = await collector.spans_where(
        lambda s: s.trace_id == row["trace_id"] and s.kind == "CLIENT"
    )
    assert (server.name, server.status) == ("tools/call trace_headers", "UNSET")
    assert server.attributes["gen_ai.tool.name"] == "trace_headers"
    assert client.parent_span_id == server.span_id
    # The result the page shows is the headers the server received: the CLIENT span's.
    assert page.has(f"{row['trace_id']}-{client.span_id}")


async def test_untraced_the_row_has_no_trace_id_and_nothing_goes_upstream(
    make_api: AppFactory, collector: Collector, traced_upstream: str
) -> None:
    api = await make_api()
    owner = await api.signup()
    server_id = await add_server(api, owner, "plain", traced_upstream)
    answer = await invoke(api, owner, server_id, "trace_headers")
    assert json.loads(answer["result"]["content"][0]["text"]) == {
        "traceparent": None,
        "tracestate": None,
    }
    assert (await row_of(api, owner, server_id))["trace_id"] is None
