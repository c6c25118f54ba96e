"""The outbound address policy (for the proxy, probes, the playground and webhooks) and the
gateway's client never taking a server's credentials anywhere else: loopback listeners only."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from aiohttp import web

from gateway.security.outbound import OutboundPolicy, parse_networks
from tests.helpers.alerting import add_rule, deliver, evaluate, ingest, receiver
from tests.helpers.alerting import add_server as add_server_named
from tests.helpers.api import Api, AppFactory
from tests.helpers.proxying import add_server, call, logged_calls
from tests.helpers.upstreams import fake_upstream, serve_loopback

METADATA = (
    "169.254.169.254",
    "::ffff:169.254.169.254",
    "64:ff9b::a9fe:a9fe",
    "fd00:ec2::254",
    "100.100.100.200",
    "::ffff:100.100.100.200",
)
# Linux dials these as the host itself: loopback, whatever GATEWAY_OUTBOUND_DENY says.
UNSPECIFIED = ("0.0.0.0", "0.1.2.3", "::", "::ffff:0.0.0.0", "64:ff9b::", "[::]")


@pytest.mark.parametrize("address", [*METADATA, *UNSPECIFIED, "fe80::1%eth0", "169.254.0.1"])
def test_link_local_metadata_and_unspecified_addresses_are_always_refused(address: str) -> None:
    loose = OutboundPolicy(allow=parse_networks("0.0.0.0/0, ::/0"))
    assert loose.refusal(address.strip("[]")) is not None


def test_private_and_loopback_are_allowed_unless_denied() -> None:
    default = OutboundPolicy()
    for address in ("127.0.0.1", "::1", "10.1.2.3", "192.168.0.9", "fd12::1", "8.8.8.8"):
        assert default.refusal(address) is None, address
    strict = OutboundPolicy(
        deny=parse_networks("10.0.0.0/8, 127.0.0.0/8, ::1"), allow=parse_networks("10.9.0.0/16")
    )
    assert strict.refusal("10.1.2.3") == "GATEWAY_OUTBOUND_DENY"
    assert strict.refusal("::ffff:127.0.0.1") == "GATEWAY_OUTBOUND_DENY"  # mapped: the same
    assert strict.refusal("::1") == "GATEWAY_OUTBOUND_DENY"
    assert strict.refusal("10.9.8.7") is None  # the exception
    assert strict.refusal("192.168.1.1") is None


async def test_refused_literals_and_user_info_are_422_at_registration(api: Api) -> None:
    owner = await api.signup()
    hosts = ("169.254.169.254", "[::ffff:169.254.169.254]", "[fe80::1]", "[fd00:ec2::254]")
    for host in (*hosts, "0.0.0.0", "[::]", "[::ffff:0.0.0.0]", "100.100.100.200"):
        body = {"name": "meta", "url": f"http://{host}/latest/meta-data/"}
        reply = await api.post("/servers", json=body, auth=owner, expect=422)
        assert reply.detail.startswith("body.url: the address is refused by the outbound policy")
        rule = {"name": "r", "metric": "call_count", "operator": ">", "threshold": 1,
                "window_minutes": 5, "webhook_url": f"http://{host}/hook"}  # fmt: skip
        reply = await api.post("/alerts/rules", json=rule, auth=owner, expect=422)
        assert reply.detail.startswith("body.webhook_url: the address is refused")
    body = {"name": "creds", "url": "https://user:secret@mcp.example/mcp"}
    reply = await api.post("/servers", json=body, auth=owner, expect=422)
    assert reply.detail == (
        "body.url: must not contain a user or password (user@host): use credentials"
    )
    created = await api.post(
        "/servers", json={"name": "ok", "url": "http://127.0.0.1:9/mcp"}, auth=owner, expect=201
    )
    reply = await api.patch(
        f"/servers/{created.body['id']}",
        json={"url": "http://169.254.169.254/"},
        auth=owner,
        expect=422,
    )
    assert reply.detail.startswith("body.url: the address is refused")


@contextlib.asynccontextmanager
async def denied_loopback(make_api: AppFactory, **more: Any) -> AsyncIterator[Api]:
    """An app refusing loopback: its upstreams are reached by the name `localhost`, so the
    refusal happens after resolution, at connect time."""
    yield await make_api(outbound_deny=parse_networks("127.0.0.0/8, ::1"), **more)


async def test_a_name_resolving_to_a_refused_address_is_refused_when_dialled(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    async with fake_upstream() as upstream, denied_loopback(make_api) as api:
        owner = await api.signup()
        url = upstream.url.replace("127.0.0.1", "localhost")
        server_id = (
            await api.post("/servers", json={"name": "n", "url": url}, auth=owner, expect=201)
        ).body["id"]  # a name: accepted now, judged when resolved
        reply = await api.post(f"/proxy/{server_id}/mcp", json=call("x"), auth=owner, expect=502)
        assert "refused by the outbound policy (GATEWAY_OUTBOUND_DENY)" in reply.detail
        probe = await api.post(f"/servers/{server_id}/probe", auth=owner, expect=200)
        assert probe.body["status"] == "down"
        assert "refused by the outbound policy" in probe.body["error"]
        reply = await api.get(f"/servers/{server_id}/tools", auth=owner, expect=502)
        assert "refused by the outbound policy" in reply.detail
    assert upstream.requests == []  # nothing ever reached it
    rows = await logged_calls(db, 1)
    assert [r["status"] for r in rows] == ["error"]
    assert "refused by the outbound policy" in rows[0]["error_message"]


async def test_the_unspecified_address_never_reaches_a_denied_loopback(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    """0.0.0.0 is dialled as the host itself: a server stored with it (before this version
    refused it at registration, or through a name that resolves to it) is refused when dialled."""
    async with fake_upstream() as upstream, denied_loopback(make_api) as api:
        owner = await api.signup()
        port = upstream.url.rsplit(":", 1)[1]
        server_id = await add_server(api, db, owner, f"http://0.0.0.0:{port}")
        reply = await api.post(f"/proxy/{server_id}/mcp", json=call("x"), auth=owner, expect=502)
        assert "refused by the outbound policy (unspecified (reaches this host))" in reply.detail
        probe = await api.post(f"/servers/{server_id}/probe", auth=owner, expect=200)
        assert probe.body["status"] == "down"
    assert upstream.requests == []


async def test_an_allowed_exception_reaches_the_upstream(make_api: AppFactory) -> None:
    async with fake_upstream() as upstream:
        api = await make_api(
            outbound_deny=parse_networks("127.0.0.0/8, ::1"),
            outbound_allow=parse_networks("127.0.0.1/32"),
        )
        owner = await api.signup()
        server_id = (
            await api.post(
                "/servers", json={"name": "n", "url": upstream.url}, auth=owner, expect=201
            )
        ).body["id"]
        probe = await api.post(f"/servers/{server_id}/probe", auth=owner, expect=200)
        assert probe.body["status"] == "healthy"


async def test_webhooks_obey_the_policy(make_api: AppFactory) -> None:
    async with receiver() as hooks, denied_loopback(make_api) as api:
        owner = await api.signup()
        server_id = await add_server_named(api, owner, "s", "http://localhost:9/mcp")
        url = hooks.url("/hook").replace("127.0.0.1", "localhost")
        await add_rule(api, owner, metric="call_count", operator=">=", webhook_url=url)
        await ingest(api, owner, server_id, [{}])
        assert await evaluate(api) == 1
        await deliver(api)
    assert hooks.received == []
    rule = await api.get("/alerts/events", auth=owner, expect=200)
    event_id = rule.body["items"][0]["id"]
    [delivery] = (await api.get(f"/alerts/events/{event_id}/deliveries", auth=owner)).body
    [attempt, *_] = delivery["attempts"]
    assert attempt["status_code"] is None
    assert "refused by the outbound policy" in attempt["error"]


async def test_the_gateways_client_never_follows_a_redirect(
    api: Api, db: asyncpg.Connection
) -> None:
    """A 307 to another origin would carry the server's stored credential there: the probe
    and the playground report it instead, and the other origin hears nothing."""
    other: list[dict[str, str]] = []

    async def elsewhere(request: web.Request) -> web.Response:
        other.append(dict(request.headers))
        return web.json_response({})

    async def redirecting(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(location=request.app["target"])

    target_app = web.Application()
    target_app.router.add_route("*", "/mcp", elsewhere)
    async with serve_loopback(target_app) as target:
        source_app = web.Application()
        source_app["target"] = target.replace("127.0.0.1", "localhost") + "/mcp"
        source_app.router.add_route("*", "/mcp", redirecting)
        async with serve_loopback(source_app) as source:
            owner = await api.signup()
            server_id = await add_server(
                api, db, owner, f"{source}/mcp", "bearer", {"token": "stored-secret"}
            )
            probe = await api.post(f"/servers/{server_id}/probe", auth=owner, expect=200)
            reply = await api.get(f"/servers/{server_id}/tools", auth=owner, expect=502)
            proxied = await api.post(
                f"/proxy/{server_id}/mcp", json=call("x"), auth=owner, expect=307
            )
    assert probe.body["status"] == "down"
    assert "redirects to localhost:" in probe.body["error"]
    assert "not followed" in probe.body["error"] and "not followed" in reply.detail
    assert proxied.headers.get("Location") is None  # passed back are MCP headers only
    assert other == []  # the credential went nowhere else
