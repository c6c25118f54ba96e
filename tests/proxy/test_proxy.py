"""The transparent proxy against real peers: the official SDK (client and server), the MCP
Inspector CLI, and small aiohttp upstreams that record what they receive."""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
import uuid

import asyncpg
import httpx2
import orjson
import pytest
from aiohttp import web
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.calllog.writer import CALL_LOG
from tests.helpers.api import Api, AppFactory
from tests.helpers.npx import INSPECTOR, inspector, npx_for
from tests.helpers.proxying import arrange, call, logged_calls, recorder, rpc, sdk_client
from tests.helpers.upstreams import unused_url

ACCEPT = "application/json, text/event-stream"


# -- the official SDK through the proxy --------------------------------------------------------


async def test_sdk_client_through_proxy(
    api: Api, db: asyncpg.Connection, sdk_peer: tuple[str, str]
) -> None:
    url, mode = sdk_peer
    setup = await arrange(api, db, url)
    async with sdk_client(setup.url, setup.key, mode, **{"X-Caller-Agent": "sdk-agent"}) as client:
        if mode == "legacy":
            assert client.protocol_version == "2025-11-25"
        else:
            assert client.protocol_version == "2026-07-28"
        tools = await client.list_tools()
        added = await client.call_tool("add", {"a": 2, "b": 40})
        echoed = await client.call_tool("echo", {"text": "héllo"})
        failed = await client.call_tool("fail", {})
    assert {"add", "echo", "fail"} <= {tool.name for tool in tools.tools}
    assert added.structured_content == {"result": 42}
    assert echoed.content[0].text == "héllo"  # type: ignore[union-attr]
    assert failed.is_error
    rows = await logged_calls(db, 3)
    assert [r["tool_name"] for r in rows] == ["add", "echo", "fail"]
    # A tool's own failure arrives in an HTTP 200 exchange, and is an error all the same.
    assert [r["status"] for r in rows] == ["success", "success", "error"]
    assert [r["error_message"] for r in rows] == [None, None, failed.content[0].text]  # type: ignore[union-attr]
    for row in rows:
        assert row["caller_agent"] == "sdk-agent"
        assert str(row["server_id"]) == setup.server_id
        assert str(row["workspace_id"]) == setup.owner.workspace_id
        assert row["duration_ms"] >= 0
        assert row["output_size_bytes"] > 0


async def test_sdk_session_alternates_between_two_gateways(
    make_api: AppFactory, db: asyncpg.Connection, sdk_stateful: str
) -> None:
    first, second = await make_api(), await make_api()
    setup = await arrange(first, db, sdk_stateful)
    assert first.client.port is not None and second.client.port is not None
    ports = itertools.cycle([first.client.port, second.client.port])
    used: list[int] = []

    class Alternating(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            port = next(ports)
            used.append(port)
            request.url = request.url.copy_with(port=port)
            return await self.inner.handle_async_request(request)

        async def aclose(self) -> None:
            await self.inner.aclose()

    http = httpx2.AsyncClient(headers={"X-API-Key": setup.key}, transport=Alternating(), timeout=30)
    client = Client(streamable_http_client(setup.url, http_client=http), mode="legacy")
    async with client:
        for i in range(4):
            result = await client.call_tool("add", {"a": i, "b": 1})
            assert result.structured_content == {"result": i + 1}
    assert set(used) == {first.client.port, second.client.port}
    await logged_calls(db, 4)


async def test_mcp_inspector_cli(api: Api, db: asyncpg.Connection, sdk_stateful: str) -> None:
    npx = await npx_for(INSPECTOR)
    setup = await arrange(api, db, sdk_stateful)
    listed = await inspector(npx, setup.url, setup.key, "--method", "tools/list")
    assert {"add", "echo"} <= {tool["name"] for tool in listed["tools"]}
    called = await inspector(
        npx,
        setup.url,
        setup.key,
        "--method",
        "tools/call",
        "--tool-name",
        "add",
        "--tool-arg",
        "a=1",
        "--tool-arg",
        "b=2",
    )
    assert called["structuredContent"] == {"result": 3}
    [row] = await logged_calls(db, 1)
    assert row["tool_name"] == "add"
    assert row["status"] == "success"


# -- streaming ---------------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/event-stream", "Text/Event-Stream; charset=utf-8"])
async def test_sse_streams_event_by_event(
    api: Api, db: asyncpg.Connection, content_type: str
) -> None:
    first_seen = asyncio.Event()
    second_sent = False

    async def two_events(request: web.Request) -> web.StreamResponse:
        nonlocal second_sent
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        await response.write(b'event: message\ndata: {"jsonrpc":"2.0","method":"progress"}\n\n')
        # Event 2 only once the client has event 1: a buffering proxy would never get here.
        await asyncio.wait_for(first_seen.wait(), timeout=10)
        second_sent = True
        await response.write(b'event: message\ndata: {"jsonrpc":"2.0","id":1,"result":{}}\n\n')
        await response.write_eof()
        return response

    async with recorder(script=two_events) as upstream:
        setup = await arrange(api, db, upstream.url)
        async with setup.stream(call("stream")) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == content_type
            assert response.headers["X-Accel-Buffering"] == "no"
            received = b""
            while b"progress" not in received:
                received += await asyncio.wait_for(response.content.readany(), timeout=10)
            assert not second_sent
            first_seen.set()
            received += await asyncio.wait_for(response.content.read(), timeout=10)
    assert second_sent
    assert received.count(b"event: message") == 2
    [row] = await logged_calls(db, 1)
    assert row["output_size_bytes"] == len(received)
    assert row["status"] == "success"


async def test_sse_stream_longer_than_the_timeout_is_not_cut(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_api(proxy_timeout_seconds=0.5)

    async def ticking(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(7):  # 1.6 s in all, never silent for 0.5 s
            await response.write(f"data: {i}\n\n".encode())
            await asyncio.sleep(0.2)
        await response.write(b'data: {"jsonrpc":"2.0","id":1,"result":{}}\n\n')
        await response.write_eof()
        return response

    async with recorder(script=ticking) as upstream:
        setup = await arrange(api, db, upstream.url)
        reply = await api.post(setup.path, json=call("tick"), auth=setup.key, expect=200)
    assert reply.body.count("data: ") == 8
    [row] = await logged_calls(db, 1)
    assert row["status"] == "success"
    assert row["duration_ms"] >= 1400  # until the response went through


# -- headers -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("auth_type", "credentials", "expected"),
    [
        (None, None, {}),
        ("bearer", {"token": "upstream-token"}, {"Authorization": "Bearer upstream-token"}),
        (
            "api_key",
            {"header_name": "X-Upstream-Key", "header_value": "k-123"},
            {"X-Upstream-Key": "k-123"},
        ),
        (
            "basic",
            {"username": "svc", "password": "pw:1"},
            {"Authorization": "Basic " + base64.b64encode(b"svc:pw:1").decode()},
        ),
    ],
)
async def test_credentials_replace_the_callers(
    api: Api,
    db: asyncpg.Connection,
    auth_type: str | None,
    credentials: dict[str, str] | None,
    expected: dict[str, str],
) -> None:
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url, auth_type=auth_type, credentials=credentials)
        sent = {
            "Accept": ACCEPT,
            "Mcp-Session-Id": "session-1",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": "add",
            "Mcp-Param-Region": "eu-west",
            "Last-Event-ID": "41",
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "tracestate": "vendor=1",
            "User-Agent": "agent/1.0",
            "X-Caller-Agent": "agent-x",
            "Cookie": "session=secret",
            "Origin": "https://evil.example",
            "X-Forwarded-For": "10.0.0.1",
            "Connection": "keep-alive",
        }
        for auth in (setup.key, setup.owner):  # an API key, then the owner's JWT
            reply = await api.post(setup.path, json=call("add", a=1), headers=sent, auth=auth)
            assert reply.status == 200
            headers = upstream.last_headers
            for name in (
                "Accept",
                "Mcp-Session-Id",
                "MCP-Protocol-Version",
                "Mcp-Method",
                "Mcp-Name",
                "Mcp-Param-Region",
                "Last-Event-ID",
                "traceparent",
                "tracestate",
                "User-Agent",
            ):
                assert headers.get(name) == sent[name], name
            assert headers["Content-Type"] == "application/json"
            assert headers["Accept-Encoding"] == "identity"
            assert headers["Host"] == upstream.url.split("/")[2]
            for name in ("X-API-Key", "Cookie", "Origin", "X-Caller-Agent", "X-Forwarded-For"):
                assert name not in headers, name
            for name, value in expected.items():
                assert headers.getall(name) == [value]
            if "Authorization" not in expected:
                assert "Authorization" not in headers
            # Only MCP response headers come back.
            assert reply.headers["Mcp-Session-Id"] == "session-1"
            assert "X-Upstream-Secret" not in reply.headers
    assert len(upstream.requests) == 2


async def test_body_forwarded_byte_for_byte(api: Api, db: asyncpg.Connection) -> None:
    raw = b'{ "jsonrpc":"2.0",  "id":7,\n "method":"tools/call","params":{"name":"caf\\u00e9"}}'
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        await api.post(
            setup.path,
            data=raw,
            auth=setup.key,
            headers={"Content-Type": "application/json"},
            expect=200,
        )
    assert upstream.requests[0][2] == raw
    [row] = await logged_calls(db, 1)
    assert row["tool_name"] == "café"


# -- statuses ----------------------------------------------------------------------------------


async def test_upstream_statuses_and_bodies_pass_through(api: Api, db: asyncpg.Connection) -> None:
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        # A notification: 202 without a body.
        reply = await api.post(
            setup.path, json=rpc("notifications/initialized", rid=None), auth=setup.key
        )
        assert (reply.status, reply.body) == (202, None)
        # GET refused by the upstream: 405 with its Allow header.
        reply = await api.get(setup.path, auth=setup.key)
        assert reply.status == 405
        assert reply.headers["Allow"] == "POST"
        for status in (400, 404, 500):
            upstream.status = status
            reply = await api.post(setup.path, json=call("broken"), auth=setup.key)
            assert (reply.status, reply.body) == (status, {"error": "scripted"})
    rows = await logged_calls(db, 3)
    assert [r["status"] for r in rows] == ["error"] * 3
    assert [r["error_message"] for r in rows] == [
        f"upstream answered HTTP {status}" for status in (400, 404, 500)
    ]
    assert all(r["output_size_bytes"] == len(b'{"error": "scripted"}') for r in rows)


async def test_delete_is_forwarded(api: Api, db: asyncpg.Connection) -> None:
    async def ended(request: web.Request) -> web.StreamResponse:
        return web.Response(status=200 if request.method == "DELETE" else 400)

    async with recorder(script=ended) as upstream:
        setup = await arrange(api, db, upstream.url)
        reply = await api.delete(setup.path, auth=setup.key, headers={"Mcp-Session-Id": "s-9"})
        assert reply.status == 200
    method, headers, _ = upstream.requests[0]
    assert method == "DELETE"
    assert headers["Mcp-Session-Id"] == "s-9"


async def test_unreachable_upstream_is_502_and_logged(api: Api, db: asyncpg.Connection) -> None:
    setup = await arrange(api, db, unused_url())
    reply = await api.post(setup.path, json=call("add", a=1), auth=setup.key, expect=502)
    assert reply.detail.startswith("upstream unreachable")
    [row] = await logged_calls(db, 1)
    assert row["status"] == "error"
    assert row["error_message"] == reply.detail
    assert row["output_size_bytes"] == 0


async def test_silent_upstream_is_504_and_logged(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_api(proxy_timeout_seconds=0.3)
    async with recorder(delay=2.0) as upstream:
        setup = await arrange(api, db, upstream.url)
        reply = await api.post(setup.path, json=call("slow"), auth=setup.key, expect=504)
    assert reply.detail == "upstream timed out after 0.3 s"
    [row] = await logged_calls(db, 1)
    assert (row["status"], row["error_message"]) == ("error", reply.detail)
    assert 300 <= row["duration_ms"] < 2000


async def test_body_over_the_limit_is_413(make_api: AppFactory, db: asyncpg.Connection) -> None:
    api = await make_api(max_body_bytes=1000)
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        big = call("big", text="x" * 2000)
        reply = await api.post(setup.path, json=big, auth=setup.key, expect=413)
        assert "1000 bytes" in reply.detail
        await api.post(setup.path, json=call("small"), auth=setup.key, expect=200)
    assert len(upstream.requests) == 1


# -- what gets logged --------------------------------------------------------------------------


async def test_log_fields(api: Api, db: asyncpg.Connection) -> None:
    async with recorder(delay=0.2) as upstream:
        setup = await arrange(api, db, upstream.url)
        before = time.time()
        reply = await api.post(
            setup.path,
            json=call("lookup", q="x"),
            auth=setup.key,
            headers={"X-Caller-Agent": "agent-7"},
            expect=200,
        )
        await api.post(setup.path, json=rpc("tools/list"), auth=setup.key, expect=200)
        await api.post(setup.path, json=call("anonymous"), auth=setup.key, expect=200)
    rows = await logged_calls(db, 2)
    row = rows[0]
    assert row["tool_name"] == "lookup"
    assert row["caller_agent"] == "agent-7"
    assert row["status"] == "success"
    assert row["error_message"] is None
    assert 200 <= row["duration_ms"] < 2000
    assert row["output_size_bytes"] == len(orjson.dumps(reply.body))
    assert row["input_tokens"] is None and row["output_tokens"] is None
    assert before - 1 <= row["created_at"].timestamp() <= time.time()
    assert (rows[1]["tool_name"], rows[1]["caller_agent"]) == ("anonymous", None)
    hourly = await db.fetch(
        "SELECT tool_name, call_count, error_count FROM tool_call_hourly ORDER BY 1"
    )
    assert [tuple(r) for r in hourly] == [("anonymous", 1, 0), ("lookup", 1, 0)]


async def test_batch_logs_each_tools_call(api: Api, db: asyncpg.Connection) -> None:
    batch = [
        call("first", 1),
        rpc("tools/list", rid=2),
        call("second", 3),
        rpc("notifications/x", rid=None),
    ]
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        reply = await api.post(setup.path, json=batch, auth=setup.key, expect=200)
    assert [m["id"] for m in reply.body] == [1, 2, 3]
    rows = await logged_calls(db, 2)
    assert sorted(r["tool_name"] for r in rows) == ["first", "second"]
    assert {r["status"] for r in rows} == {"success"}


async def test_bodies_without_tools_call_are_not_parsed_or_logged(
    api: Api, db: asyncpg.Connection
) -> None:
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        await api.post(setup.path, json=rpc("tools/list"), auth=setup.key, expect=200)
        # Mentions tools/call, but not as the method.
        await api.post(
            setup.path, json=rpc("echo", {"text": "tools/call"}), auth=setup.key, expect=200
        )
    await asyncio.sleep(0.1)
    assert api.app[CALL_LOG].stats.written == 0
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 0


# -- access ------------------------------------------------------------------------------------


async def test_tenant_isolation(api: Api, db: asyncpg.Connection) -> None:
    async with recorder() as upstream:
        mine = await arrange(api, db, upstream.url)
        theirs = await arrange(api, db, upstream.url)
        # Another workspace's server does not exist for me, by key or by token.
        for auth in (mine.key, mine.owner):
            reply = await api.post(theirs.path, json=call("x"), auth=auth, expect=404)
            assert reply.detail == "server not found"
        await api.post(f"/proxy/{uuid.uuid4()}/mcp", json=call("x"), auth=mine.key, expect=404)
        await api.post("/proxy/not-a-uuid/mcp", json=call("x"), auth=mine.key, expect=404)
        await api.post(mine.path, json=call("x"), expect=401)
        await api.post(mine.path, json=call("x"), auth="mcpg_unknown", expect=401)
        await api.post(mine.path, json=call("mine"), auth=mine.key, expect=200)
        await api.post(theirs.path, json=call("theirs"), auth=theirs.key, expect=200)
    assert len(upstream.requests) == 2
    await logged_calls(db, 2)
    listed = await api.get("/tool-calls", auth=mine.key, expect=200)
    assert [item["tool_name"] for item in listed.body["items"]] == ["mine"]
    listed = await api.get("/tool-calls", auth=theirs.owner, expect=200)
    assert [item["tool_name"] for item in listed.body["items"]] == ["theirs"]


async def test_cookies_an_upstream_sets_reach_no_other_request(
    api: Api, db: asyncpg.Connection
) -> None:
    async def set_cookie(request: web.Request) -> web.StreamResponse:
        response = web.json_response({"jsonrpc": "2.0", "id": 1, "result": {}})
        response.set_cookie("upstream_session", "tenant-a-secret")
        return response

    async with recorder(script=set_cookie) as upstream:
        # By name: aiohttp's default cookie jar would ignore cookies of a bare IP address.
        url = upstream.url.replace("127.0.0.1", "localhost")
        first = await arrange(api, db, url)
        second = await arrange(api, db, url)  # another tenant, the same upstream host
        reply = await api.post(first.path, json=call("x"), auth=first.key, expect=200)
        assert reply.headers.get("Set-Cookie") is None  # not an MCP header: not passed back
        await api.post(second.path, json=call("x"), auth=second.key, expect=200)
        await api.post(first.path, json=call("x"), auth=first.key, expect=200)
    assert len(upstream.requests) == 3
    assert all("Cookie" not in headers for _, headers, _ in upstream.requests)


async def test_cors(api: Api, db: asyncpg.Connection) -> None:
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        origin = {"Origin": "https://app.example"}
        reply = await api.request(
            "OPTIONS",
            setup.path,
            headers={
                **origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "x-api-key, content-type, mcp-param-region",
            },
        )
        assert reply.status == 204
        assert reply.headers["Access-Control-Allow-Origin"] == "*"
        assert "POST" in reply.headers["Access-Control-Allow-Methods"]
        assert "mcp-param-region" in reply.headers["Access-Control-Allow-Headers"]
        reply = await api.post(
            setup.path, json=call("x"), auth=setup.key, headers=origin, expect=200
        )
        assert reply.headers["Access-Control-Allow-Origin"] == "*"
        assert "Mcp-Session-Id" in reply.headers["Access-Control-Expose-Headers"]
        # Errors are readable by the browser too.
        reply = await api.post(setup.path, json=call("x"), headers=origin, expect=401)
        assert reply.headers["Access-Control-Allow-Origin"] == "*"
        # Other routes are not opened by the proxy's CORS.
        reply = await api.get("/auth/me", auth=setup.owner, headers=origin, expect=200)
        assert "Access-Control-Allow-Origin" not in reply.headers
    # The preflight never reaches the upstream.
    assert len(upstream.requests) == 1
