"""Traces of alert notifications: each delivery attempt is a CLIENT span (channel, workspace,
rule, result), ERROR when it failed, its context in the POST's traceparent; untraced, the POST
carries nothing new. Spans are received by a real OTLP/HTTP collector on loopback; the
receivers are real loopback servers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.background.notifier import deliver_due
from gateway.keys import HTTP, POOL
from gateway.ops.metrics import METRICS
from gateway.ops.tracing import TRACING
from tests.helpers.alerting import (
    FAST,
    add_rule,
    add_server,
    deliver,
    evaluate,
    ingest,
    receiver,
)
from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.otlp import Collector, ReceivedSpan, parse_traceparent, tracing_env
from tests.helpers.upstreams import unused_url


async def failing_rule(api: Api, **targets: str | None) -> tuple[Account, dict[str, Any]]:
    """A rule that fires at its first evaluation, notifying `targets`."""
    owner = await api.signup()
    server = await add_server(api, owner, "billing")
    await ingest(api, owner, server, [{"status": "error"}])
    rule = await add_rule(
        api, owner, name="Errors", metric="error_rate", operator=">", threshold=0.5, **targets
    )
    return owner, rule


async def traced_deliver(api: Api) -> int:
    app = api.app
    return await deliver_due(app[POOL], app[HTTP], FAST, app[METRICS], app[TRACING])


def attempts(collector: Collector) -> list[ReceivedSpan]:
    return [span for span in collector.spans if span.name == "alert notification"]


async def test_each_attempt_is_a_span_and_the_post_carries_its_context(
    make_api: AppFactory, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracing_env(monkeypatch, collector.endpoint)
    api = await make_api(tracing=True)
    async with receiver() as recv:
        recv.script["/hook"] = [503]
        owner, rule = await failing_rule(
            api, webhook_url=recv.url("/hook"), slack_webhook_url=recv.url("/slack")
        )
        await evaluate(api)
        # Slack once, the webhook twice: its first attempt fails, its retry is due after the
        # backoff (within the same round, on a slow machine).
        attempted = 0
        for _ in range(50):
            attempted += await traced_deliver(api)
            if attempted >= 3:
                break
            await asyncio.sleep(FAST.backoff_seconds)
        assert attempted == 3
        spans = await collector.spans_where(lambda s: s.name == "alert notification", at_least=3)
    me = await api.get("/auth/me", auth=owner, expect=200)
    workspace_id = me.body["current_workspace"]["id"]

    assert len(spans) == 3
    for span in spans:
        assert (span.kind, span.parent_span_id) == ("CLIENT", None)
        assert span.attributes["mcp_gateway.workspace.id"] == workspace_id
        assert span.attributes["mcp_gateway.alert.rule.id"] == rule["id"]
        assert span.attributes["server.address"] == "127.0.0.1"
    slack = [s for s in spans if s.attributes["mcp_gateway.alert.channel"] == "slack"]
    hooks = [s for s in spans if s.attributes["mcp_gateway.alert.channel"] == "webhook"]
    assert len(slack) == 1 and len(hooks) == 2
    failed, retried = sorted(hooks, key=lambda s: s.attributes["mcp_gateway.alert.attempt"])
    assert (failed.status, failed.attributes["error.type"]) == ("ERROR", "503")
    assert failed.attributes["mcp_gateway.alert.result"] == "retry"
    assert failed.attributes["http.response.status_code"] == 503
    assert failed.status_message.startswith("HTTP 503")
    for delivered in (retried, slack[0]):
        assert delivered.status == "UNSET"
        assert delivered.attributes["mcp_gateway.alert.result"] == "delivered"
        assert delivered.attributes["http.response.status_code"] == 200
        assert "error.type" not in delivered.attributes
    assert retried.attributes["mcp_gateway.alert.attempt"] == 2
    assert (
        failed.attributes["mcp_gateway.alert.delivery.id"]
        == (retried.attributes["mcp_gateway.alert.delivery.id"])
    )

    # Each POST carried its own attempt's span as the parent.
    sent = [parse_traceparent(r.headers["traceparent"]) for r in recv.received]
    assert sorted(sent) == sorted((s.trace_id, s.span_id) for s in spans)


async def test_an_attempt_that_reaches_nobody_is_an_error_span_and_the_last_says_failed(
    make_api: AppFactory, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracing_env(monkeypatch, collector.endpoint)
    api = await make_api(tracing=True)
    await failing_rule(api, webhook_url=unused_url())
    await evaluate(api)
    for _ in range(FAST.max_attempts):
        assert await traced_deliver(api) == 1
        await asyncio.sleep(FAST.backoff_seconds * 4)
    spans = await collector.spans_where(
        lambda s: s.name == "alert notification", at_least=FAST.max_attempts
    )
    spans.sort(key=lambda s: s.attributes["mcp_gateway.alert.attempt"])
    results = [s.attributes["mcp_gateway.alert.result"] for s in spans]
    assert results == ["retry"] * (FAST.max_attempts - 1) + ["failed"]
    for span in spans:
        assert span.status == "ERROR"
        assert span.attributes["error.type"] == "ClientConnectorError"
        assert "http.response.status_code" not in span.attributes


async def test_untraced_the_post_carries_no_trace_context(api: Api) -> None:
    async with receiver() as recv:
        await failing_rule(api, webhook_url=recv.url("/hook"))
        await evaluate(api)
        assert await deliver(api) == 1
    [received] = recv.received
    assert "traceparent" not in received.headers
    assert received.headers["X-Alert-Delivery-Id"]
