"""Traces of probes: each probe is a CLIENT span of its own (server, workspace, status), ERROR
when the server is down, its context sent with each of the probe's requests; untraced, the
requests carry nothing new. Spans are received by a real OTLP/HTTP collector on loopback."""

from __future__ import annotations

import pytest

from gateway.background.prober import Prober
from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.otlp import Collector, parse_traceparent, tracing_env
from tests.helpers.upstreams import fake_upstream, unused_url


async def register(api: Api, admin: Account, url: str, name: str) -> str:
    reply = await api.post("/servers", json={"name": name, "url": url}, auth=admin, expect=201)
    server_id: str = reply.body["id"]
    return server_id


async def workspace_of(api: Api, account: Account) -> str:
    me = await api.get("/auth/me", auth=account, expect=200)
    workspace_id: str = me.body["current_workspace"]["id"]
    return workspace_id


async def test_each_probe_is_a_span_with_its_status_and_sends_its_context(
    make_api: AppFactory, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracing_env(monkeypatch, collector.endpoint)
    api = await make_api(tracing=True)
    admin = await api.signup()
    workspace_id = await workspace_of(api, admin)
    async with fake_upstream() as up, fake_upstream(rpc_error=(-32603, "no")) as degraded:
        ids = {
            await register(api, admin, up.url, "up"): "healthy",
            await register(api, admin, degraded.url, "degraded"): "degraded",
            await register(api, admin, unused_url(), "down"): "down",
        }
        assert await Prober.from_app(api.app).run_round() == 3

    spans = await collector.spans_where(lambda s: s.name == "probe", at_least=3)
    assert len(spans) == 3
    by_server = {span.attributes["mcp_gateway.server.id"]: span for span in spans}
    assert {sid: s.attributes["mcp_gateway.probe.status"] for sid, s in by_server.items()} == ids
    for span in spans:
        assert (span.kind, span.parent_span_id) == ("CLIENT", None)
        assert span.attributes["mcp_gateway.workspace.id"] == workspace_id
        assert span.attributes["server.address"] == "127.0.0.1"
    healthy, slow, down = (by_server[sid] for sid in ids)
    assert (healthy.status, slow.status) == ("UNSET", "UNSET")
    assert "error.type" not in healthy.attributes
    assert (down.status, down.attributes["error.type"]) == ("ERROR", "unreachable")
    assert "connection refused" in down.status_message
    assert len({span.trace_id for span in spans}) == 3  # a trace each

    # Every request of a probe (the handshake, the tool list, the session's end) carries
    # that probe's span as its parent.
    for fake, span in ((up, healthy), (degraded, slow)):
        assert fake.requests
        sent = {parse_traceparent(r.headers["traceparent"]) for r in fake.requests}
        assert sent == {(span.trace_id, span.span_id)}


async def test_untraced_probes_send_no_trace_context(api: Api) -> None:
    admin = await api.signup()
    async with fake_upstream() as up:
        await register(api, admin, up.url, "up")
        prober = Prober.from_app(api.app)
        assert prober.tracing is None
        assert await prober.run_round() == 1
    assert up.requests
    assert all("traceparent" not in r.headers for r in up.requests)
