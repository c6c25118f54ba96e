"""/servers: registry CRUD, validation, filters, paging, credentials (and where they may go),
the per-workspace bound, roles and tenancy, probes."""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import re
import uuid
from typing import Any

import asyncpg
import orjson
import pytest

from gateway.api.openapi import OPENAPI_DOCUMENT
from gateway.background.prober import Prober
from gateway.keys import HTTP
from gateway.mcp.client import McpClient
from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.proxying import add_server
from tests.helpers.upstreams import SDK_TOOL_NAMES, FakeUpstream, fake_upstream, unused_url

_names = itertools.count(1)


async def register(api: Api, admin: Account, **fields: Any) -> dict[str, Any]:
    body = {"name": f"server-{next(_names)}", "url": "http://127.0.0.1:9/mcp", **fields}
    reply = await api.post("/servers", json=body, auth=admin, expect=201)
    server: dict[str, Any] = reply.body
    return server


async def probe(api: Api, admin: Account, server_id: str) -> dict[str, Any]:
    reply = await api.post(f"/servers/{server_id}/probe", auth=admin, expect=200)
    check: dict[str, Any] = reply.body
    return check


# -- the registry ------------------------------------------------------------------------------


async def test_register_then_read_back(api: Api) -> None:
    admin = await api.signup()
    created = await register(
        api,
        admin,
        name="  Weather  ",
        url="https://mcp.example.com/mcp",
        description="forecasts",
        tags=["prod", "weather", "prod"],
    )
    assert created == {
        "id": created["id"],
        "name": "Weather",
        "url": "https://mcp.example.com/mcp",
        "description": "forecasts",
        "tags": ["prod", "weather"],
        "auth_type": None,
        "has_credentials": False,
        "status": "unknown",
        "last_checked_at": None,
        "last_latency_ms": None,
        "tool_count": None,
        "tools_changed_at": None,
        "created_at": created["created_at"],
        "updated_at": created["updated_at"],
        "disabled_tools": [],
        "rate_limit": None,
        "pin_tools": False,
        "tools_waiting": 0,
        "proxy_url": f"http://gateway.test/api/v1/proxy/{created['id']}/mcp",
    }
    assert (await api.get(f"/servers/{created['id']}", auth=admin, expect=200)).body == created
    assert (await api.get("/servers", auth=admin, expect=200)).body == [created]


async def test_the_proxy_url_is_absolute_from_public_url(make_api: AppFactory) -> None:
    """Agents are given the URL users reach the gateway at (PUBLIC_URL, a trailing slash
    dropped), or http://GATEWAY_HOST:GATEWAY_PORT without it; every server object has it."""
    behind_proxy = await make_api(public_url="https://mcp.example.org/")
    admin = await behind_proxy.signup()
    created = await register(behind_proxy, admin)
    expected = f"https://mcp.example.org/api/v1/proxy/{created['id']}/mcp"
    assert created["proxy_url"] == expected
    path = f"/servers/{created['id']}"
    assert (await behind_proxy.get(path, auth=admin, expect=200)).body["proxy_url"] == expected
    [listed] = (await behind_proxy.get("/servers", auth=admin, expect=200)).body
    assert listed["proxy_url"] == expected
    patch = {"description": "moved"}
    changed = (await behind_proxy.patch(path, json=patch, auth=admin, expect=200)).body
    assert changed["proxy_url"] == expected
    key = await behind_proxy.api_key(admin)
    assert (await behind_proxy.get(path, auth=key, expect=200)).body["proxy_url"] == expected

    by_default = await make_api(public_url=None, host="127.0.0.1", port=8123)
    admin = await by_default.signup()
    created = await register(by_default, admin)
    assert created["proxy_url"] == f"http://127.0.0.1:8123/api/v1/proxy/{created['id']}/mcp"


_INVALID_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"url": "http://x.test/mcp"}, "body.name"),
    ({"name": "  ", "url": "http://x.test/mcp"}, "body.name"),
    ({"name": "a"}, "body.url"),
    ({"name": "a", "url": "ftp://x.test/mcp"}, "body.url"),
    ({"name": "a", "url": "not a url"}, "body.url"),
    ({"name": "a", "url": "http:///mcp"}, "body.url"),
    ({"name": "a", "url": "http://x.test:99999/mcp"}, "body.url"),
    ({"name": "a", "url": 5}, "body.url"),
    ({"name": "a", "url": "http://x.test", "tags": "prod"}, "body.tags"),
    ({"name": "a", "url": "http://x.test", "tags": [""]}, "body.tags.0"),
    ({"name": "a", "url": "http://x.test", "auth_type": "oauth"}, "body.auth_type"),
]


async def test_register_validation(api: Api) -> None:
    admin = await api.signup()
    for body, field in _INVALID_BODIES:
        reply = await api.post("/servers", json=body, auth=admin, expect=422)
        assert reply.detail.startswith(f"{field}:"), (body, reply.detail)
    await api.post("/servers", data="[]", auth=admin, expect=400)
    await api.post("/servers", data="{nope", auth=admin, expect=400)


_BAD_CREDENTIALS: list[tuple[str | None, Any, list[str]]] = [
    ("bearer", None, ["body.auth_credentials.token"]),
    ("bearer", {}, ["body.auth_credentials.token"]),
    ("bearer", {"token": 42}, ["body.auth_credentials.token"]),
    ("bearer", {"token": "line\nbreak"}, ["body.auth_credentials.token"]),
    ("api_key", {}, ["body.auth_credentials.header_name", "body.auth_credentials.header_value"]),
    ("api_key", {"header_name": "X-Key"}, ["body.auth_credentials.header_value"]),
    ("api_key", {"header_name": "X Key", "header_value": "v"}, ["header_name"]),
    ("api_key", {"header_name": "Mcp-Session-Id", "header_value": "v"}, ["header_name"]),
    ("basic", {"username": "u"}, ["body.auth_credentials.password"]),
    ("basic", {"username": "a:b", "password": "p"}, ["body.auth_credentials.username"]),
    ("basic", "user:pass", ["body.auth_credentials"]),
    (None, {"token": "t"}, ["body.auth_credentials"]),
]


async def test_credentials_follow_the_auth_type(api: Api) -> None:
    admin = await api.signup()
    for auth_type, credentials, named in _BAD_CREDENTIALS:
        body = {"name": "a", "url": "http://x.test/mcp", "auth_type": auth_type}
        if credentials is not None:
            body["auth_credentials"] = credentials
        reply = await api.post("/servers", json=body, auth=admin, expect=422)
        for field in named:
            assert field in reply.detail, (auth_type, credentials, reply.detail)
    assert (await api.get("/servers", auth=admin, expect=200)).body == []


async def test_credentials_are_never_returned_stored_plain_or_logged(
    api: Api, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "s3cret-token-" + uuid.uuid4().hex
    admin = await api.signup()
    async with fake_upstream(required_headers={"Authorization": f"Bearer {secret}"}) as fake:
        server = await register(
            api, admin, url=fake.url, auth_type="bearer", auth_credentials={"token": secret}
        )
        check = await probe(api, admin, server["id"])
    assert check["status"] == "healthy"
    assert server["auth_type"] == "bearer" and server["has_credentials"] is True
    replies = [
        server,
        check,
        (await api.get(f"/servers/{server['id']}", auth=admin, expect=200)).body,
        (await api.get("/servers", auth=admin, expect=200)).body,
        (await api.patch(f"/servers/{server['id']}", json={}, auth=admin, expect=200)).body,
        (await api.get("/health/checks", auth=admin, expect=200)).body,
    ]
    for body in replies:
        assert secret not in orjson.dumps(body).decode()
    stored = await db.fetchval("SELECT credentials FROM servers WHERE id = $1", server["id"])
    assert secret.encode() not in stored
    assert secret not in caplog.text


async def test_duplicate_name_is_400_within_a_workspace_only(api: Api) -> None:
    admin = await api.signup()
    await register(api, admin, name="Search")
    reply = await api.post(
        "/servers", json={"name": "Search", "url": "http://x.test/mcp"}, auth=admin, expect=400
    )
    assert reply.detail == "a server with this name already exists in this workspace"
    other = await register(api, admin, name="Other")
    await api.patch(f"/servers/{other['id']}", json={"name": "Search"}, auth=admin, expect=400)
    stranger = await api.signup()
    await register(api, stranger, name="Search")


async def test_patch_changes_only_supplied_fields(api: Api) -> None:
    admin = await api.signup()
    server = await register(api, admin, description="before", tags=["a"])
    path = f"/servers/{server['id']}"
    changed = (await api.patch(path, json={"description": "after"}, auth=admin, expect=200)).body
    assert changed == {
        **server,
        "description": "after",
        "updated_at": changed["updated_at"],
    }
    assert changed["updated_at"] > server["updated_at"]
    changed = (
        await api.patch(
            path,
            json={"name": "Renamed", "url": "http://y.test/mcp", "tags": ["b", "c"], "x": 1},
            auth=admin,
            expect=200,
        )
    ).body
    assert (changed["name"], changed["url"], changed["tags"]) == (
        "Renamed",
        "http://y.test/mcp",
        ["b", "c"],
    )
    assert changed["description"] == "after"
    # null for a field that cannot be empty leaves it as it is
    assert (await api.patch(path, json={"name": None}, auth=admin, expect=200)).body[
        "name"
    ] == "Renamed"
    reply = await api.patch(path, json={"url": "gopher://x"}, auth=admin, expect=422)
    assert reply.detail.startswith("body.url:")
    await api.patch(path, json=[1], auth=admin, expect=400)
    await api.patch(path, data="{", auth=admin, expect=400)


async def test_patch_credentials_rules(api: Api) -> None:
    admin = await api.signup()
    async with fake_upstream() as fake:
        server = await register(
            api, admin, url=fake.url, auth_type="bearer", auth_credentials={"token": "one"}
        )
        path = f"/servers/{server['id']}"

        async def sent_authorization() -> str | None:
            fake.requests.clear()
            await probe(api, admin, server["id"])
            return fake.requests[-1].headers.get("Authorization")

        assert await sent_authorization() == "Bearer one"

        # credentials alone replace those of the current type
        reply = await api.patch(
            path, json={"auth_credentials": {"token": "two"}}, auth=admin, expect=200
        )
        assert reply.body["auth_type"] == "bearer" and reply.body["has_credentials"]
        assert await sent_authorization() == "Bearer two"

        # ... and are validated against it
        reply = await api.patch(
            path, json={"auth_credentials": {"username": "u"}}, auth=admin, expect=422
        )
        assert "body.auth_credentials.token" in reply.detail

        # a new auth_type needs credentials of its shape
        reply = await api.patch(path, json={"auth_type": "basic"}, auth=admin, expect=422)
        assert "body.auth_credentials.username" in reply.detail
        assert "body.auth_credentials.password" in reply.detail

        # re-sending the current type (an edited copy of a GET) keeps the stored credentials
        copy = {k: server[k] for k in ("name", "url", "description", "tags", "auth_type")}
        await api.patch(path, json=copy, auth=admin, expect=200)
        assert await sent_authorization() == "Bearer two"

        reply = await api.patch(
            path,
            json={"auth_type": "basic", "auth_credentials": {"username": "u", "password": "p"}},
            auth=admin,
            expect=200,
        )
        assert reply.body["auth_type"] == "basic"
        assert await sent_authorization() == "Basic " + base64.b64encode(b"u:p").decode()

        # null clears them
        reply = await api.patch(path, json={"auth_type": None}, auth=admin, expect=200)
        assert reply.body["auth_type"] is None and reply.body["has_credentials"] is False
        assert await sent_authorization() is None

        # without an auth_type there is nothing to replace
        reply = await api.patch(
            path, json={"auth_credentials": {"token": "t"}}, auth=admin, expect=422
        )
        assert reply.detail.startswith("body.auth_credentials:")


async def test_filters(api: Api) -> None:
    admin = await api.signup()
    down = await register(
        api,
        admin,
        name="Search_Engine",
        url=unused_url(),
        description="Finds 100% of things",
        tags=["prod", "search"],
    )
    await probe(api, admin, down["id"])
    other = await register(api, admin, name="calendar", url="http://cal.test/mcp", tags=["dev"])

    async def names(**params: str) -> list[str]:
        reply = await api.get("/servers", params=params, auth=admin, expect=200)
        return [s["name"] for s in reply.body]

    assert await names() == ["Search_Engine", "calendar"]
    assert await names(status="down") == ["Search_Engine"]
    assert await names(status="unknown") == ["calendar"]
    assert await names(status="healthy") == []
    assert await names(tag="prod") == ["Search_Engine"]
    assert await names(tag="pro") == []
    assert await names(search="search_e") == ["Search_Engine"]
    assert await names(search="CAL.TEST") == ["calendar"]  # url
    assert await names(search="100%") == ["Search_Engine"]  # description
    assert await names(search="h_e") == ["Search_Engine"]  # _ is literal
    assert await names(search="%") == ["Search_Engine"]
    assert await names(tag="dev", search="cal") == ["calendar"]
    assert await names(tag="dev", status="down") == []
    reply = await api.get("/servers", params={"status": "sleepy"}, auth=admin, expect=422)
    assert reply.detail.startswith("query.status:")
    assert other["status"] == "unknown"


async def test_delete_removes_the_server_and_its_checks(api: Api, db: asyncpg.Connection) -> None:
    admin = await api.signup()
    server = await register(api, admin, url=unused_url())
    await probe(api, admin, server["id"])
    await probe(api, admin, server["id"])
    assert await db.fetchval("SELECT count(*) FROM health_checks") == 2
    path = f"/servers/{server['id']}"
    reply = await api.delete(path, auth=admin, expect=204)
    assert reply.body is None
    await api.get(path, auth=admin, expect=404)
    await api.delete(path, auth=admin, expect=404)
    await api.post(f"{path}/probe", auth=admin, expect=404)
    assert await db.fetchval("SELECT count(*) FROM health_checks") == 0
    assert await db.fetchval("SELECT count(*) FROM health_hourly") == 0
    checks = await api.get("/health/checks", auth=admin, expect=200)
    assert checks.body == {"items": [], "total": 0}


# -- who may do what -----------------------------------------------------------------------------


async def test_roles_api_keys_and_tenancy(api: Api) -> None:
    owner = await api.org(await api.signup())
    admin = await api.member(owner, "admin")
    member = await api.member(owner, "member")
    key = await api.api_key(owner)
    stranger = await api.signup()
    async with fake_upstream() as fake:
        server = await register(api, admin, url=fake.url)
        path = f"/servers/{server['id']}"
        reads = [("GET", "/servers"), ("GET", path)]
        writes: list[tuple[str, str, Any]] = [
            ("POST", "/servers", {"name": "x", "url": "http://x.test/mcp"}),
            ("PATCH", path, {"description": "x"}),
            ("POST", f"{path}/probe", None),
            ("DELETE", path, None),
        ]
        for caller in (owner, admin, member, key):
            for method, url in reads:
                await api.request(method, url, auth=caller, expect=200)
        for caller in (member, key):
            for method, url, body in writes:
                reply = await api.request(method, url, json=body, auth=caller, expect=403)
                assert reply.detail
        for method, url in reads:
            await api.request(method, url, expect=401)
        for method, url, body in writes:
            await api.request(method, url, json=body, expect=401)

        # another workspace sees nothing and cannot reach the server by id
        assert (await api.get("/servers", auth=stranger, expect=200)).body == []
        for method, url, body in [("GET", path, None), *writes[1:]]:
            await api.request(method, url, json=body, auth=stranger, expect=404)
        # malformed ids are unknown ids
        await api.get("/servers/not-a-uuid", auth=admin, expect=404)
        await api.post("/servers/not-a-uuid/probe", auth=admin, expect=404)

        await api.post(f"{path}/probe", auth=admin, expect=200)
        await api.post(f"{path}/probe", auth=owner, expect=200)
        await api.patch(path, json={"description": "ok"}, auth=admin, expect=200)
        await api.delete(path, auth=admin, expect=204)


# -- probes through the registry -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("auth_type", "credentials", "header", "value"),
    [
        ("bearer", {"token": "tok-123"}, "Authorization", "Bearer tok-123"),
        (
            "api_key",
            {"header_name": "X-Upstream-Key", "header_value": "key-456"},
            "X-Upstream-Key",
            "key-456",
        ),
        (
            "basic",
            {"username": "alice", "password": "pä ss"},
            "Authorization",
            "Basic " + base64.b64encode("alice:pä ss".encode()).decode(),
        ),
    ],
)
async def test_stored_credentials_reach_the_upstream(
    api: Api, auth_type: str, credentials: dict[str, str], header: str, value: str
) -> None:
    admin = await api.signup()
    async with fake_upstream(required_headers={header: value}) as fake:
        server = await register(
            api, admin, url=fake.url, auth_type=auth_type, auth_credentials=credentials
        )
        check = await probe(api, admin, server["id"])
        assert check["status"] == "healthy", check
        assert fake.requests and all(r.headers.get(header) == value for r in fake.requests)
        # the caller's own token never goes upstream
        assert all(admin.access_token not in str(r.headers) for r in fake.requests)

        unauthenticated = await register(api, admin, url=fake.url)
        check = await probe(api, admin, unauthenticated["id"])
    assert check["status"] == "down"
    assert check["error"] == "HTTP 401 Unauthorized: missing or wrong credentials"


def _assert_server_follows(server: dict[str, Any], check: dict[str, Any]) -> None:
    assert server["status"] == check["status"]
    assert server["last_checked_at"] == check["checked_at"]
    assert server["last_latency_ms"] == check["latency_ms"]


@pytest.mark.parametrize("mode", ["sdk_sse_url", "sdk_json_url"])
async def test_probe_of_sdk_server_is_healthy(
    api: Api, mode: str, request: pytest.FixtureRequest
) -> None:
    admin = await api.signup()
    server = await register(api, admin, url=request.getfixturevalue(mode))
    check = await probe(api, admin, server["id"])
    assert check == {
        "id": check["id"],
        "server_id": server["id"],
        "status": "healthy",
        "latency_ms": check["latency_ms"],
        "error": None,
        "tool_count": check["tool_count"],
        "tools_hash": check["tools_hash"],
        "checked_at": check["checked_at"],
    }
    assert check["tool_count"] >= len(SDK_TOOL_NAMES)
    assert len(check["tools_hash"]) == 64
    assert 0 < check["latency_ms"] < 1000
    after = (await api.get(f"/servers/{server['id']}", auth=admin, expect=200)).body
    _assert_server_follows(after, check)
    assert after["tool_count"] == check["tool_count"]
    assert after["tools_changed_at"] is None


async def test_probe_statuses_and_their_reasons(make_api: Any) -> None:
    api: Api = await make_api(probe_timeout_seconds=0.5, degraded_latency_ms=150)
    admin = await api.signup()
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"delay": 0.2}, "down", "timed out after 0.5 s"),
        ({"status": 401}, "down", "HTTP 401 Unauthorized"),
        ({"status": 500}, "down", "HTTP 500 Internal Server Error"),
        (
            {"rpc_error": (-32603, "tool backend unavailable")},
            "degraded",
            "JSON-RPC error -32603: tool backend unavailable",
        ),
        ({"delay": 0.06}, "degraded", "over the 150 ms threshold"),
        ({"html_body": True}, "down", "invalid response"),
        ({"legacy_sse": True}, "down", "unsupported transport"),
    ]
    for behaviour, status, reason in cases:
        async with fake_upstream(**behaviour) as fake:
            server = await register(api, admin, url=fake.url)
            check = await probe(api, admin, server["id"])
        assert (check["status"], behaviour) == (status, behaviour)
        assert reason in check["error"], check["error"]
        after = (await api.get(f"/servers/{server['id']}", auth=admin, expect=200)).body
        _assert_server_follows(after, check)

    refused = await register(api, admin, url=unused_url())
    check = await probe(api, admin, refused["id"])
    assert check["status"] == "down"
    assert check["error"].startswith("connection refused"), check["error"]
    assert check["tool_count"] is None and check["tools_hash"] is None


async def test_tools_changed_at_follows_the_sdk_servers_tool_list(
    api: Api, sdk_sse_url: str
) -> None:
    admin = await api.signup()
    server = await register(api, admin, url=sdk_sse_url)
    first = await probe(api, admin, server["id"])
    again = await probe(api, admin, server["id"])
    assert again["tools_hash"] == first["tools_hash"]
    path = f"/servers/{server['id']}"
    assert (await api.get(path, auth=admin, expect=200)).body["tools_changed_at"] is None

    async with McpClient(api.app[HTTP], sdk_sse_url, {}, 10) as client:
        await client.call_tool("register_tool", {"name": f"added_{uuid.uuid4().hex[:8]}"})
    changed = await probe(api, admin, server["id"])
    assert changed["tools_hash"] != first["tools_hash"]
    assert changed["tool_count"] == first["tool_count"] + 1
    after = (await api.get(path, auth=admin, expect=200)).body
    assert after["tools_changed_at"] == changed["checked_at"]
    assert after["tool_count"] == changed["tool_count"]

    unchanged = await probe(api, admin, server["id"])
    assert unchanged["tools_hash"] == changed["tools_hash"]
    assert (await api.get(path, auth=admin, expect=200)).body["tools_changed_at"] == changed[
        "checked_at"
    ]


async def test_a_failed_probe_keeps_the_last_tool_list(api: Api) -> None:
    """A server that goes down and comes back with other tools shows the change."""
    admin = await api.signup()
    async with fake_upstream() as fake:
        server = await register(api, admin, url=fake.url)
        path = f"/servers/{server['id']}"
        healthy = await probe(api, admin, server["id"])
        fake.status = 503
        down = await probe(api, admin, server["id"])
        assert down["status"] == "down" and down["tools_hash"] is None
        after = (await api.get(path, auth=admin, expect=200)).body
        assert after["status"] == "down"
        assert after["tool_count"] == healthy["tool_count"] == 5
        assert after["tools_changed_at"] is None
        fake.status = None
        fake.tools = fake.tools[:3]
        back = await probe(api, admin, server["id"])
    after = (await api.get(path, auth=admin, expect=200)).body
    assert after["status"] == "healthy"
    assert after["tool_count"] == 3
    assert after["tools_changed_at"] == back["checked_at"]


async def test_url_change_is_probed_soon(api: Api, db: asyncpg.Connection) -> None:
    admin = await api.signup()
    server = await register(api, admin)
    await db.execute("UPDATE servers SET next_probe_at = now() + interval '1 hour'")
    path = f"/servers/{server['id']}"
    await api.patch(path, json={"description": "same address"}, auth=admin, expect=200)
    due = "SELECT next_probe_at <= now() FROM servers WHERE id = $1"
    assert await db.fetchval(due, server["id"]) is False
    await api.patch(path, json={"url": "http://elsewhere.test/mcp"}, auth=admin, expect=200)
    assert await db.fetchval(due, server["id"]) is True


# -- credentials stay with the origin they were given for ----------------------------------------


def _sent(fake: FakeUpstream, secret: str) -> list[str]:
    """Every header (name: value) that reached the fake and carries `secret` or any
    Authorization at all."""
    return [
        f"{name}: {value}"
        for request in fake.requests
        for name, value in request.headers.items()
        if secret in value or name.lower() == "authorization"
    ]


async def _through_the_proxy(api: Api, key: str, server_id: str) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    await api.post(
        f"/proxy/{server_id}/mcp",
        json=initialize,
        auth=key,
        headers={"Accept": "application/json, text/event-stream"},
        expect=200,
    )


async def test_a_url_on_another_origin_drops_the_stored_credentials(api: Api) -> None:
    """PATCHing only the url to another host must not hand the token to that host: not
    through an on-demand probe, the background prober, nor the proxy."""
    admin = await api.signup()
    key = await api.api_key(admin)
    secret = "s3cret-" + uuid.uuid4().hex
    async with fake_upstream() as old, fake_upstream() as new:
        server = await register(
            api, admin, url=old.url, auth_type="bearer", auth_credentials={"token": secret}
        )
        await _through_the_proxy(api, key, server["id"])  # the proxy caches the upstream
        assert old.requests[-1].headers["Authorization"] == f"Bearer {secret}"
        path = f"/servers/{server['id']}"

        moved = await api.patch(path, json={"url": new.url}, auth=admin, expect=200)
        assert moved.body["url"] == new.url
        assert (moved.body["auth_type"], moved.body["has_credentials"]) == (None, False)
        after = (await api.get(path, auth=admin, expect=200)).body
        assert (after["auth_type"], after["has_credentials"]) == (None, False)

        await _through_the_proxy(api, key, server["id"])
        assert (await probe(api, admin, server["id"]))["status"] == "healthy"
        assert await Prober.from_app(api.app).run_round() == 1  # moved: due at once
        assert {r.rpc_method for r in new.requests} >= {"initialize", "tools/list"}
        assert _sent(new, secret) == []

        # New credentials for the new host are kept and sent there.
        await api.patch(
            path,
            json={"auth_type": "bearer", "auth_credentials": {"token": "for-the-new-host"}},
            auth=admin,
            expect=200,
        )
        new.requests.clear()
        await probe(api, admin, server["id"])
        assert {r.headers.get("Authorization") for r in new.requests} == {"Bearer for-the-new-host"}


async def test_a_url_on_the_same_origin_keeps_the_stored_credentials(api: Api) -> None:
    admin = await api.signup()
    async with fake_upstream() as fake:
        server = await register(
            api, admin, url=fake.url, auth_type="bearer", auth_credentials={"token": "kept"}
        )
        path = f"/servers/{server['id']}"
        # Another path and query, the scheme and host in other letter case: the same origin.
        same = fake.url.replace("http://", "HTTP://").replace("/mcp", "/mcp?v=2")
        reply = await api.patch(path, json={"url": same}, auth=admin, expect=200)
        assert (reply.body["auth_type"], reply.body["has_credentials"]) == ("bearer", True)
        await probe(api, admin, server["id"])
    assert {r.headers.get("Authorization") for r in fake.requests} == {"Bearer kept"}

    # The default port written out or left out is the same origin; another scheme, port or
    # host is not (127.0.0.1 and localhost included: an origin is compared, not an address).
    cases = [
        ("https://mcp.example.com/mcp", "https://MCP.Example.com:443/v2", True),
        ("http://mcp.example.com:80/mcp", "http://mcp.example.com/", True),
        ("https://mcp.example.com/mcp", "http://mcp.example.com:443/mcp", False),
        ("http://mcp.example.com/mcp", "http://mcp.example.com:8080/mcp", False),
        ("http://mcp.example.com/mcp", "http://other.example.com/mcp", False),
        ("http://127.0.0.1:8000/mcp", "http://localhost:8000/mcp", False),
    ]
    for before, after, kept in cases:
        server = await register(
            api,
            admin,
            url=before,
            auth_type="api_key",
            auth_credentials={"header_name": "X-Key", "header_value": "v"},
        )
        reply = await api.patch(f"/servers/{server['id']}", json={"url": after}, auth=admin)
        assert reply.status == 200
        assert reply.body["has_credentials"] is kept, (before, after)
        assert reply.body["auth_type"] == ("api_key" if kept else None)
        if not kept:
            # Credentials alone need an auth_type to be of: after a move, give both.
            reply = await api.patch(
                f"/servers/{server['id']}", json={"auth_credentials": {"token": "t"}}, auth=admin
            )
            assert reply.status == 422 and reply.detail.startswith("body.auth_credentials:")


async def test_a_url_with_new_credentials_keeps_the_new_ones(api: Api) -> None:
    admin = await api.signup()
    async with fake_upstream() as old, fake_upstream() as new:
        server = await register(
            api, admin, url=old.url, auth_type="bearer", auth_credentials={"token": "old"}
        )
        path = f"/servers/{server['id']}"
        # Credentials alone are of the stored auth_type, now for the new url.
        reply = await api.patch(
            path, json={"url": new.url, "auth_credentials": {"token": "new"}}, auth=admin
        )
        assert (reply.status, reply.body["has_credentials"]) == (200, True)
        await probe(api, admin, server["id"])
        assert {r.headers.get("Authorization") for r in new.requests} == {"Bearer new"}
        # ... and a new auth_type with its credentials, back on the old url.
        reply = await api.patch(
            path,
            json={
                "url": old.url,
                "auth_type": "api_key",
                "auth_credentials": {"header_name": "X-Upstream-Key", "header_value": "k"},
            },
            auth=admin,
            expect=200,
        )
        assert (reply.body["auth_type"], reply.body["has_credentials"]) == ("api_key", True)
        old.requests.clear()
        await probe(api, admin, server["id"])
    assert {r.headers.get("X-Upstream-Key") for r in old.requests} == {"k"}
    assert {r.headers.get("Authorization") for r in old.requests} == {None}


async def test_a_refused_move_changes_nothing(api: Api, db: asyncpg.Connection) -> None:
    """A PATCH that is refused (a new auth_type without its credentials) leaves url and
    credentials as they were."""
    admin = await api.signup()
    server = await register(
        api,
        admin,
        url="https://a.example/mcp",
        auth_type="bearer",
        auth_credentials={"token": "t"},
    )
    await api.patch(
        f"/servers/{server['id']}",
        json={"url": "https://b.example/mcp", "auth_type": "basic"},
        auth=admin,
        expect=422,
    )
    row = await db.fetchrow("SELECT url, auth_type, credentials IS NOT NULL AS sealed FROM servers")
    assert row is not None
    assert tuple(row) == ("https://a.example/mcp", "bearer", True)


# -- credential header names ---------------------------------------------------------------------

_REFUSED_HEADER_NAMES = [
    "Connection",
    "keep-alive",
    "Proxy-Authorization",
    "Proxy-Authenticate",
    "TE",
    "Trailer",
    "Transfer-Encoding",
    "Upgrade",
    "Cookie",
    "set-cookie",
    "Host",
    "Forwarded",
    "X-Forwarded-For",
    "x-forwarded-host",
    "X-Real-IP",
    "Via",
    "Expect",
    "Origin",
    "Content-Length",
    "Content-Type",
    "content-encoding",
    "Mcp-Session-Id",
    "MCP-Protocol-Version",
    "Mcp-Method",
    "Mcp-Param-Region",
    "traceparent",
    "TraceState",
    "baggage",
    "Accept",
    "Accept-Encoding",
    "Last-Event-ID",
]
_ALLOWED_HEADER_NAMES = ["X-Upstream-Key", "Authorization", "X-API-Key", "Api-Key", "X-Token"]


def _header_name_pattern(api: Api) -> str:
    schema = api.app[OPENAPI_DOCUMENT]["components"]["schemas"]["ServerIn"]
    (shape,) = [s for s in schema["oneOf"] if "header_name" in str(s)]
    pattern: str = shape["properties"]["auth_credentials"]["properties"]["header_name"]["pattern"]
    return pattern


async def test_hop_by_hop_and_sensitive_header_names_are_refused(api: Api) -> None:
    """As a POST and as a PATCH, with 422 naming the field and the header, and the document's
    pattern says the same."""
    admin = await api.signup()
    existing = await register(api, admin)
    pattern = _header_name_pattern(api)
    for name in _REFUSED_HEADER_NAMES:
        credentials = {"header_name": name, "header_value": "v"}
        body = {"name": "x", "url": "http://x.test/mcp", "auth_type": "api_key"}
        reply = await api.post(
            "/servers", json={**body, "auth_credentials": credentials}, auth=admin, expect=422
        )
        assert reply.detail.startswith("body.auth_credentials.header_name:"), reply.detail
        assert f"{name} is not allowed as a credential header" in reply.detail
        reply = await api.patch(
            f"/servers/{existing['id']}",
            json={"auth_type": "api_key", "auth_credentials": credentials},
            auth=admin,
            expect=422,
        )
        assert "header_name" in reply.detail
        assert not re.search(pattern, name), name
    for name in _ALLOWED_HEADER_NAMES:
        assert re.search(pattern, name), name
        server = await register(
            api,
            admin,
            auth_type="api_key",
            auth_credentials={"header_name": name, "header_value": "v"},
        )
        assert server["has_credentials"] is True
    assert len((await api.get("/servers", auth=admin, expect=200)).body) == 6


async def test_a_stored_credential_under_a_refused_name_is_not_sent(
    api: Api, db: asyncpg.Connection
) -> None:
    """Stored before such names were refused: the gateway sends nothing rather than it."""
    admin = await api.signup()
    async with fake_upstream() as fake:
        server_id = await add_server(
            api, db, admin, fake.url, "api_key", {"header_name": "Cookie", "header_value": "x=1"}
        )
        await probe(api, admin, server_id)
    assert fake.requests
    assert all("Cookie" not in r.headers for r in fake.requests)


# -- paging ---------------------------------------------------------------------------------------


async def test_the_list_pages_with_limit_and_offset(api: Api) -> None:
    admin = await api.signup()
    for name in ("echo", "alpha", "delta", "bravo", "charlie"):
        await register(api, admin, name=name, tags=["t"] if name != "echo" else [])

    async def names(**params: Any) -> list[str]:
        reply = await api.get("/servers", params=params, auth=admin, expect=200)
        assert isinstance(reply.body, list)  # still a plain array
        return [s["name"] for s in reply.body]

    everything = ["alpha", "bravo", "charlie", "delta", "echo"]
    assert await names() == everything
    assert await names(limit=2) == everything[:2]
    assert await names(limit=2, offset=2) == everything[2:4]
    assert await names(limit=2, offset=4) == everything[4:]
    assert await names(offset=5) == []
    assert await names(limit=1000, offset=1) == everything[1:]
    assert await names(tag="t", limit=2, offset=2) == ["charlie", "delta"]
    for params, field in [
        ({"limit": 0}, "query.limit"),
        ({"limit": 1001}, "query.limit"),
        ({"limit": "x"}, "query.limit"),
        ({"offset": -1}, "query.offset"),
    ]:
        reply = await api.get("/servers", params=params, auth=admin, expect=422)
        assert reply.detail.startswith(f"{field}:"), reply.detail


async def test_without_a_limit_the_list_stops_at_a_thousand(
    api: Api, db: asyncpg.Connection
) -> None:
    admin = await api.signup()
    await db.execute(
        "INSERT INTO servers (workspace_id, name, url) "
        "SELECT $1, 's' || lpad(i::text, 4, '0'), 'http://127.0.0.1:9/mcp' "
        "FROM generate_series(1, 1001) AS i",
        uuid.UUID(admin.workspace_id),
    )
    listed = (await api.get("/servers", auth=admin, expect=200)).body
    assert len(listed) == 1000
    assert (listed[0]["name"], listed[-1]["name"]) == ("s0001", "s1000")
    rest = (await api.get("/servers", params={"offset": 1000}, auth=admin, expect=200)).body
    assert [s["name"] for s in rest] == ["s1001"]


# -- the per-workspace bound ----------------------------------------------------------------------


async def test_a_workspace_holds_at_most_its_bound_of_servers(make_api: AppFactory) -> None:
    api = await make_api(max_servers_per_workspace=3)
    admin = await api.signup()
    kept = [await register(api, admin) for _ in range(3)]
    body = {"name": "one-too-many", "url": "http://x.test/mcp"}
    reply = await api.post("/servers", json=body, auth=admin, expect=422)
    assert reply.detail == (
        "this workspace has 3 servers, the most this gateway allows "
        "(GATEWAY_MAX_SERVERS_PER_WORKSPACE): delete one first"
    )
    assert len((await api.get("/servers", auth=admin, expect=200)).body) == 3
    # Another workspace has a bound of its own.
    stranger = await api.signup()
    await register(api, stranger)
    # Deleting one makes room again.
    await api.delete(f"/servers/{kept[0]['id']}", auth=admin, expect=204)
    await api.post("/servers", json=body, auth=admin, expect=201)
    await api.post("/servers", json={**body, "name": "again"}, auth=admin, expect=422)


async def test_the_bound_holds_for_registrations_at_once(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_api(max_servers_per_workspace=4)
    admin = await api.signup()
    await register(api, admin)
    replies = await asyncio.gather(
        *(
            api.post("/servers", json={"name": f"rush-{i}", "url": "http://x.test/mcp"}, auth=admin)
            for i in range(12)
        )
    )
    assert sorted(r.status for r in replies) == [201] * 3 + [422] * 9
    assert await db.fetchval("SELECT count(*) FROM servers") == 4
