"""McpClient against the official SDK server (both eras, SSE and JSON) and the fake upstream."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import aiohttp
import orjson
import pytest

from gateway.mcp.client import ConnectMode, McpClient
from gateway.mcp.errors import (
    McpConnectionError,
    McpHttpError,
    McpResponseError,
    McpRpcError,
    McpTimeoutError,
    ToolListTooLarge,
    UnsupportedTransport,
)
from gateway.mcp.tool_list_budget import ToolListMemory
from tests.helpers.hostile import MiB, hostile_lister
from tests.helpers.upstreams import SDK_TOOL_NAMES, fake_upstream, unused_url

POST_ACCEPT = "application/json, text/event-stream"


@dataclass
class Wire:
    """What our client put on the wire, recorded with aiohttp's own tracing hooks."""

    sent: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def methods(self) -> list[str]:
        return [method for method, _ in self.sent]


@pytest.fixture
async def traced() -> AsyncIterator[tuple[aiohttp.ClientSession, Wire]]:
    wire = Wire()

    async def on_start(
        session: aiohttp.ClientSession,
        ctx: SimpleNamespace,
        params: aiohttp.TraceRequestStartParams,
    ) -> None:
        wire.sent.append((params.method, dict(params.headers)))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    async with aiohttp.ClientSession(auto_decompress=False, trace_configs=[trace]) as session:
        yield session, wire


def text_of(result: dict[str, object]) -> str:
    content = result["content"]
    assert isinstance(content, list)
    text = content[0]["text"]
    assert isinstance(text, str)
    return text


# --- the official SDK server -------------------------------------------------------------


@pytest.mark.parametrize("server", ["sdk_sse_url", "sdk_json_url"])
async def test_modern_era_by_default(
    server: str, request: pytest.FixtureRequest, http: aiohttp.ClientSession
) -> None:
    url = request.getfixturevalue(server)
    async with McpClient(http, url, {}, 10) as client:
        assert client.protocol_version == "2026-07-28"
        assert client.session_id is None
        assert client.server_info == {"name": "sdk-test-upstream", "version": ""}
        tools = await client.list_tools()
        result = await client.call_tool("add", {"a": 2, "b": 40})
    assert {tool["name"] for tool in tools} >= SDK_TOOL_NAMES
    assert result["structuredContent"] == {"result": 42}
    assert result["isError"] is False


@pytest.mark.parametrize("server", ["sdk_sse_url", "sdk_json_url"])
async def test_handshake_era(
    server: str, request: pytest.FixtureRequest, http: aiohttp.ClientSession
) -> None:
    url = request.getfixturevalue(server)
    async with McpClient(http, url, {}, 10, mode="legacy") as client:
        assert client.protocol_version == "2025-11-25"
        # Only the stateful server issues a session.
        assert (client.session_id is not None) == (server == "sdk_sse_url")
        tools = await client.list_tools()
        assert text_of(await client.call_tool("echo", {"text": "héllo"})) == "héllo"
    assert {tool["name"] for tool in tools} >= SDK_TOOL_NAMES


async def test_wire_headers_of_both_eras(
    traced: tuple[aiohttp.ClientSession, Wire], sdk_sse_url: str
) -> None:
    http, wire = traced
    async with McpClient(http, sdk_sse_url, {"X-Api-Key": "k1"}, 10) as client:
        await client.call_tool("echo", {"text": "a"})
    discover, call = wire.sent
    assert discover[0] == "POST"
    assert discover[1]["MCP-Protocol-Version"] == "2026-07-28"
    assert discover[1]["Mcp-Method"] == "server/discover"
    assert call[1]["Mcp-Method"] == "tools/call"
    assert call[1]["Mcp-Name"] == "echo"
    for _, headers in wire.sent:
        assert headers["Accept"] == POST_ACCEPT
        assert headers["Content-Type"] == "application/json"
        assert headers["X-Api-Key"] == "k1"
        assert "Mcp-Session-Id" not in headers

    wire.sent.clear()
    async with McpClient(http, sdk_sse_url, {"X-Api-Key": "k1"}, 10, mode="legacy") as client:
        session_id = client.session_id
        await client.list_tools()
    initialize, initialized, *lists, delete = wire.sent
    assert [m for m, _ in lists] == ["POST"] * len(lists)
    assert len(lists) >= 4  # seven tools, two per page
    assert delete[0] == "DELETE"
    assert "MCP-Protocol-Version" not in initialize[1]
    for _, headers in (initialized, *lists, delete):
        assert headers["Mcp-Session-Id"] == session_id
        assert headers["MCP-Protocol-Version"] == "2025-11-25"
        assert headers["X-Api-Key"] == "k1"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_pagination_of_the_sdk_server(
    mode: ConnectMode, http: aiohttp.ClientSession, sdk_sse_url: str
) -> None:
    """That server pages tools/list two at a time; the client must follow nextCursor."""
    async with McpClient(http, sdk_sse_url, {}, 10, mode=mode) as client:
        names = [tool["name"] for tool in await client.list_tools()]
    assert len(names) == len(set(names))
    assert set(names) >= SDK_TOOL_NAMES


async def test_sse_event_over_512_kib(http: aiohttp.ClientSession, sdk_sse_url: str) -> None:
    text = "0123456789abcdef" * 50_000  # 800 kB in one SSE data line
    async with McpClient(http, sdk_sse_url, {}, 20, mode="legacy") as client:
        assert text_of(await client.call_tool("echo", {"text": text})) == text


async def test_resumes_a_stream_the_server_closed_early(
    traced: tuple[aiohttp.ClientSession, Wire], sdk_sse_url: str
) -> None:
    http, wire = traced
    async with McpClient(http, sdk_sse_url, {}, 10, mode="legacy") as client:
        result = await client.call_tool("polled", {"seconds": 0.3})
        session_id = client.session_id
    assert text_of(result) == "polled result"
    gets = [headers for method, headers in wire.sent if method == "GET"]
    assert gets, "the server closed the POST stream; the answer can only come through a GET"
    assert gets[0]["Last-Event-ID"]
    assert gets[0]["Mcp-Session-Id"] == session_id


async def test_tool_error_is_a_result_not_an_exception(
    http: aiohttp.ClientSession, sdk_json_url: str
) -> None:
    async with McpClient(http, sdk_json_url, {}, 10) as client:
        result = await client.call_tool("fail", {})
    assert result["isError"] is True


@pytest.mark.parametrize("region", ["eu-west", "Zürich "])
async def test_mcp_param_header_for_annotated_argument(
    region: str, http: aiohttp.ClientSession, sdk_json_url: str
) -> None:
    """2026-07-28: the server answers -32020 unless Mcp-Param-Region mirrors the argument.

    The first call happens before any tools/list, so the client must list and retry once.
    """
    async with McpClient(http, sdk_json_url, {}, 10) as client:
        assert (
            text_of(await client.call_tool("region_of", {"region": region})) == f"region {region}"
        )
        assert text_of(await client.call_tool("region_of", {"region": "ap"})) == "region ap"


async def test_session_deleted_on_exit(http: aiohttp.ClientSession, sdk_sse_url: str) -> None:
    async with McpClient(http, sdk_sse_url, {}, 10, mode="legacy") as client:
        session_id = client.session_id
        await client.list_tools()
    assert session_id is not None
    headers = {
        "Accept": POST_ACCEPT,
        "Content-Type": "application/json",
        "Mcp-Session-Id": session_id,
        "MCP-Protocol-Version": "2025-11-25",
    }
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    async with http.post(sdk_sse_url, data=body, headers=headers) as resp:
        assert resp.status == 404


async def test_handshakes_again_when_the_session_expires(
    http: aiohttp.ClientSession, sdk_sse_url: str
) -> None:
    async with McpClient(http, sdk_sse_url, {}, 10, mode="legacy") as client:
        first = client.session_id
        assert first is not None
        # End the session behind the client's back, as an upstream restart would.
        headers = {"Mcp-Session-Id": first, "MCP-Protocol-Version": "2025-11-25"}
        async with http.delete(sdk_sse_url, headers=headers) as resp:
            assert resp.status == 200
        assert text_of(await client.call_tool("add", {"a": 1, "b": 1})) == "2"
        assert client.session_id not in (None, first)


async def test_legacy_http_sse_sdk_server_is_unsupported(
    http: aiohttp.ClientSession, sdk_legacy_sse_url: str
) -> None:
    with pytest.raises(UnsupportedTransport, match="unsupported transport"):
        async with McpClient(http, sdk_legacy_sse_url, {}, 5):
            pass


# --- the fake upstream --------------------------------------------------------------------


@pytest.mark.parametrize("sse", [False, True])
async def test_falls_back_to_handshake_when_discover_is_refused(
    sse: bool, http: aiohttp.ClientSession
) -> None:
    async with (
        fake_upstream(sse=sse, protocol_version="2025-06-18", page_size=2) as fake,
        McpClient(http, fake.url, {}, 5) as client,
    ):
        assert client.protocol_version == "2025-06-18"
        session_id = client.session_id
        tools = await client.list_tools()
        result = await client.call_tool("echo", {"x": "1"})
    assert [tool["name"] for tool in tools] == ["alpha", "bravo", "charlie", "delta", "echo"]
    assert text_of(result) == '{"x":"1"}'
    assert fake.rpc_methods() == [
        "server/discover",
        "initialize",
        "notifications/initialized",
        "tools/list",
        "tools/list",
        "tools/list",
        "tools/call",
    ]
    discover, initialize, *later = [r for r in fake.requests if r.method == "POST"]
    assert discover.headers["MCP-Protocol-Version"] == "2026-07-28"
    assert discover.headers["Mcp-Method"] == "server/discover"
    assert initialize.body["params"] == {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "mcp-gateway", "version": "0.1.0"},
    }
    for recorded in later:
        assert recorded.headers["Mcp-Session-Id"] == session_id
        assert recorded.headers["MCP-Protocol-Version"] == "2025-06-18"
        assert "Mcp-Method" not in recorded.headers
    cursors = [
        (r.body.get("params") or {}).get("cursor") for r in later if r.rpc_method == "tools/list"
    ]
    assert cursors == [None, "2", "4"]
    assert fake.deleted_sessions == [session_id]


async def test_handshakes_again_once_against_the_fake(http: aiohttp.ClientSession) -> None:
    async with fake_upstream() as fake, McpClient(http, fake.url, {}, 5) as client:
        fake.sessions.clear()
        await client.list_tools()
        assert fake.rpc_methods().count("initialize") == 2
        # A server that forgets sessions at once gets one new handshake, then an error, not a loop.
        fake.expire_sessions = True
        with pytest.raises(McpHttpError, match=r"^HTTP 404 Not Found: session expired again"):
            await client.list_tools()
        assert fake.rpc_methods().count("initialize") == 3


async def test_credentials_on_every_request_and_never_logged(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = {"Authorization": "Bearer s3cret-token"}
    async with fake_upstream(required_headers=secret) as fake:
        async with McpClient(http, fake.url, secret, 5) as client:
            await client.list_tools()
        assert [r.method for r in fake.requests] == ["POST"] * 4 + ["DELETE"]
        assert all(r.headers["Authorization"] == "Bearer s3cret-token" for r in fake.requests)

        with pytest.raises(McpHttpError) as caught:
            async with McpClient(http, fake.url, {"Authorization": "Bearer wrong"}, 5):
                pass
    assert caught.value.status == 401
    assert str(caught.value) == "HTTP 401 Unauthorized: missing or wrong credentials"
    assert "s3cret" not in caplog.text


async def test_connection_refused(http: aiohttp.ClientSession) -> None:
    with pytest.raises(McpConnectionError, match="connection refused"):
        async with McpClient(http, unused_url(), {}, 5):
            pass


async def test_timeout(http: aiohttp.ClientSession) -> None:
    async with fake_upstream(delay=1.0) as fake:
        with pytest.raises(McpTimeoutError, match=r"^timed out after 0\.2 s$"):
            async with McpClient(http, fake.url, {}, 0.2):
                pass


@pytest.mark.parametrize(
    ("status", "text"), [(500, "HTTP 500 Internal Server Error"), (403, "HTTP 403 Forbidden")]
)
async def test_http_status(status: int, text: str, http: aiohttp.ClientSession) -> None:
    async with fake_upstream(status=status) as fake:
        with pytest.raises(McpHttpError) as caught:
            async with McpClient(http, fake.url, {}, 5):
                pass
    assert caught.value.status == status
    assert str(caught.value) == text


async def test_json_rpc_error(http: aiohttp.ClientSession) -> None:
    async with (
        fake_upstream(rpc_error=(-32603, "tool backend unavailable")) as fake,
        McpClient(http, fake.url, {}, 5) as client,
    ):
        with pytest.raises(McpRpcError) as caught:
            await client.list_tools()
    assert caught.value.code == -32603
    assert str(caught.value) == "JSON-RPC error -32603: tool backend unavailable"


async def test_invalid_response(http: aiohttp.ClientSession) -> None:
    async with fake_upstream(html_body=True) as fake:
        with pytest.raises(
            McpResponseError, match=r"^invalid response: unexpected Content-Type 'text/html'"
        ):
            async with McpClient(http, fake.url, {}, 5):
                pass


async def test_legacy_http_sse_fake_is_unsupported(http: aiohttp.ClientSession) -> None:
    async with fake_upstream(legacy_sse=True) as fake:
        with pytest.raises(UnsupportedTransport, match="unsupported transport"):
            async with McpClient(http, fake.url, {}, 5):
                pass
    assert [r.method for r in fake.requests] == ["POST", "POST", "GET"]


async def test_a_405_without_endpoint_event_stays_an_http_error(
    http: aiohttp.ClientSession,
) -> None:
    async with fake_upstream(status=405) as fake:
        with pytest.raises(McpHttpError, match="HTTP 405 Method Not Allowed"):
            async with McpClient(http, fake.url, {}, 5):
                pass


# --- tool lists within bounds ----------------------------------------------------------------


async def until(condition: object, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "reply", [{"sse": False}, {"sse": True}, {"sse": False, "announce_length": True}]
)
async def test_a_tool_list_over_8_mib_is_refused_and_its_connection_dropped(
    reply: dict[str, bool], http: aiohttp.ClientSession
) -> None:
    async with hostile_lister(page_bytes=100 * MiB, **reply) as lister:
        async with McpClient(http, lister.url, {}, 30) as client:
            with pytest.raises(ToolListTooLarge, match=r"^the tool list exceeds 8 MiB$"):
                await client.list_tools()
        # The client hung up long before the end: it read no more than its bound, and what
        # the kernel's socket buffers took on top.
        await until(lambda: lister.hung_up == 1)
    [sent] = lister.sent
    assert sent < 24 * MiB


async def test_the_8_mib_are_counted_over_every_page(http: aiohttp.ClientSession) -> None:
    async with (
        hostile_lister(page_bytes=1 * MiB, pages=50, tool_bytes=8192) as lister,
        McpClient(http, lister.url, {}, 30) as client,
    ):
        with pytest.raises(ToolListTooLarge, match="exceeds 8 MiB"):
            await client.list_tools()
    assert 8 <= lister.lists <= 9  # eight pages of a little over 1 MiB fit, the ninth does not


async def test_a_list_within_the_bounds_is_read_whole(http: aiohttp.ClientSession) -> None:
    async with hostile_lister(page_bytes=1 * MiB, pages=7, tool_bytes=8192, sse=True) as lister:
        memory = ToolListMemory()
        async with McpClient(http, lister.url, {}, 30, memory=memory, owner="w1") as client:
            tools = await client.list_tools()
    assert len(tools) == 7 * 128
    assert len({tool["name"] for tool in tools}) == len(tools)
    assert memory.in_use == 0  # given back once the list was returned


@pytest.mark.parametrize(("per_page", "pages"), [(2001, 1), (700, 3)])
async def test_more_than_2000_tools_are_refused(
    per_page: int, pages: int, http: aiohttp.ClientSession
) -> None:
    async with (
        hostile_lister(tool_count=per_page, pages=pages) as lister,
        McpClient(http, lister.url, {}, 30) as client,
    ):
        with pytest.raises(ToolListTooLarge, match=r"^the tool list has more than 2,000 tools$"):
            await client.list_tools()


async def test_exactly_2000_tools_are_read(http: aiohttp.ClientSession) -> None:
    async with (
        hostile_lister(tool_count=1000, pages=2) as lister,
        McpClient(http, lister.url, {}, 30) as client,
    ):
        assert len(await client.list_tools()) == 2000


async def test_a_list_too_costly_to_parse_is_refused_before_it_is_parsed(
    http: aiohttp.ClientSession,
) -> None:
    """7 MiB of empty objects would take about 170 MB once parsed."""
    async with (
        hostile_lister(empty_objects=7 * MiB) as lister,
        McpClient(http, lister.url, {}, 30) as client,
    ):
        with pytest.raises(ToolListTooLarge, match=r"^the tool list is too large to read: "):
            await client.list_tools()


async def test_large_lists_take_permits_one_per_owner() -> None:
    memory = ToolListMemory(permits=2, free=1 * MiB)
    first = memory.hold("w1")
    await first.grow(2 * MiB)
    assert first.permitted and memory.in_use == 1

    same_owner = memory.hold("w1")
    waiting = asyncio.create_task(same_owner.grow(2 * MiB))
    other = memory.hold("w2")
    await other.grow(2 * MiB)  # another workspace takes the second permit at once
    third = memory.hold("w3")
    also_waiting = asyncio.create_task(third.grow(2 * MiB))
    small = memory.hold("w4")
    await small.grow(512 * 1024)  # within the free allowance: never waits
    await asyncio.sleep(0.05)
    assert not waiting.done() and not also_waiting.done()

    first.release()  # w1's next list goes first: it came first
    await asyncio.wait_for(waiting, 1)
    assert not also_waiting.done()
    other.release()
    await asyncio.wait_for(also_waiting, 1)
    same_owner.release()
    third.release()
    small.release()
    assert memory.in_use == 0


async def test_a_list_given_up_while_waiting_takes_no_permit_away() -> None:
    memory = ToolListMemory(permits=1, free=0)
    holder = memory.hold("w1")
    await holder.grow(1)
    gave_up = memory.hold("w2")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(gave_up.grow(1), 0.05)
    holder.release()
    assert memory.in_use == 0
    later = memory.hold("w3")
    await asyncio.wait_for(later.grow(1), 1)
    later.release()


async def test_a_large_list_waits_for_its_owners_permit(http: aiohttp.ClientSession) -> None:
    """One workspace's large lists are read one at a time, so it never holds both permits."""
    memory = ToolListMemory(permits=2, free=256 * 1024)
    async with hostile_lister(page_bytes=1 * MiB) as lister:
        held = memory.hold("w1")
        await held.grow(1 * MiB)
        async with McpClient(http, lister.url, {}, 0.5, memory=memory, owner="w1") as client:
            with pytest.raises(McpTimeoutError):
                await client.list_tools()
        async with McpClient(http, lister.url, {}, 10, memory=memory, owner="w2") as client:
            assert len(await client.list_tools()) == 1024
        held.release()
        async with McpClient(http, lister.url, {}, 10, memory=memory, owner="w1") as client:
            assert len(await client.list_tools()) == 1024
    assert memory.in_use == 0


async def test_reading_the_costliest_list_allowed_holds_the_event_loop_only_briefly(
    http: aiohttp.ClientSession,
) -> None:
    """2.6 MiB of empty objects: just under the memory bound (about 93 MiB estimated, 60 MB
    parsed), so read in full, and parsed in one go. Unbounded lists held the loop for seconds."""
    done = asyncio.Event()
    longest = 0.0

    async def watch() -> None:
        nonlocal longest
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.005)
            longest = max(longest, time.perf_counter() - before)

    async with (
        hostile_lister(empty_objects=int(2.6 * MiB)) as lister,
        McpClient(http, lister.url, {}, 30) as client,
    ):
        watcher = asyncio.create_task(watch())
        tools = await client.list_tools()
        done.set()
        await watcher
    assert len(tools) == 1
    # About 0.1 s on an idle machine; the bound is the issue's "under a second", which a
    # busy CI machine still keeps (unbounded lists held the loop for seconds).
    assert longest < 1.0, f"the event loop was held for {longest:.3f} s"
