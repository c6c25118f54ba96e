"""probe(): every status and error message, against the SDK server and the fake upstream."""

from __future__ import annotations

import dataclasses

import aiohttp
import pytest

from gateway.mcp.client import McpClient
from gateway.mcp.probe import ProbeResult, probe, tools_hash
from gateway.mcp.tool_list_budget import ToolListMemory
from tests.helpers.hostile import MiB, hostile_lister
from tests.helpers.upstreams import SDK_TOOL_NAMES, default_tools, fake_upstream, unused_url

THRESHOLD_MS = 1000.0


async def test_result_is_a_frozen_slotted_record(http: aiohttp.ClientSession) -> None:
    result = await probe(http, unused_url(), {}, timeout=2, degraded_ms=THRESHOLD_MS)
    assert isinstance(result, ProbeResult)
    assert not hasattr(result, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.status = "healthy"  # type: ignore[misc]


@pytest.mark.parametrize("server", ["sdk_sse_url", "sdk_json_url"])
async def test_healthy_sdk_server(
    server: str, request: pytest.FixtureRequest, http: aiohttp.ClientSession
) -> None:
    url = request.getfixturevalue(server)
    result = await probe(http, url, {}, timeout=10, degraded_ms=THRESHOLD_MS)
    async with McpClient(http, url, {}, 10) as client:
        tools = await client.list_tools()
    assert result.status == "healthy"
    assert result.error is None
    assert result.tool_count == len(tools) >= len(SDK_TOOL_NAMES)
    assert result.tools_hash == tools_hash(tools)
    assert 0 < result.latency_ms < THRESHOLD_MS


async def test_healthy_handshake_only_upstream_and_its_session_is_ended(
    http: aiohttp.ClientSession,
) -> None:
    async with fake_upstream(sse=True, page_size=2) as fake:
        result = await probe(http, fake.url, {}, timeout=5, degraded_ms=THRESHOLD_MS)
    assert result.status == "healthy"
    assert result.tool_count == 5
    assert result.tools_hash == tools_hash(default_tools())
    assert len(fake.deleted_sessions) == 1


async def test_tools_hash_follows_the_tool_list(
    http: aiohttp.ClientSession, sdk_json_url: str
) -> None:
    first = await probe(http, sdk_json_url, {}, timeout=10, degraded_ms=THRESHOLD_MS)
    again = await probe(http, sdk_json_url, {}, timeout=10, degraded_ms=THRESHOLD_MS)
    assert first.tools_hash == again.tools_hash
    assert first.tools_hash is not None and len(first.tools_hash) == 64

    async with McpClient(http, sdk_json_url, {}, 10) as client:
        await client.call_tool("register_tool", {"name": "added_by_probe_test"})
    changed = await probe(http, sdk_json_url, {}, timeout=10, degraded_ms=THRESHOLD_MS)
    assert changed.status == "healthy"
    assert changed.tools_hash != first.tools_hash
    assert changed.tool_count == (first.tool_count or 0) + 1


def test_tools_hash_ignores_order_but_not_content() -> None:
    tools = default_tools()
    shuffled = [dict(reversed(list(tool.items()))) for tool in reversed(tools)]
    assert tools_hash(shuffled) == tools_hash(tools)
    edited = default_tools()
    edited[2]["description"] = "now does something else"
    assert tools_hash(edited) != tools_hash(tools)
    assert tools_hash(tools[:-1]) != tools_hash(tools)


async def test_degraded_when_slow(http: aiohttp.ClientSession) -> None:
    async with fake_upstream(delay=0.3) as fake:
        result = await probe(http, fake.url, {}, timeout=10, degraded_ms=50)
    assert result.status == "degraded"
    assert result.tool_count == 5
    assert result.tools_hash == tools_hash(default_tools())
    assert result.latency_ms > 50
    assert result.error is not None and "over the 50 ms threshold" in result.error


async def test_degraded_on_json_rpc_error(http: aiohttp.ClientSession) -> None:
    async with fake_upstream(rpc_error=(-32603, "tool backend unavailable")) as fake:
        result = await probe(http, fake.url, {}, timeout=5, degraded_ms=THRESHOLD_MS)
    assert result.status == "degraded"
    assert result.error == "JSON-RPC error -32603: tool backend unavailable"
    assert result.tool_count is None
    assert result.tools_hash is None


async def test_down_when_refused(http: aiohttp.ClientSession) -> None:
    result = await probe(http, unused_url(), {}, timeout=5, degraded_ms=THRESHOLD_MS)
    assert result.status == "down"
    assert result.error is not None and result.error.startswith("connection refused")
    assert result.tool_count is None and result.tools_hash is None


async def test_down_on_timeout_bounds_the_whole_probe(http: aiohttp.ClientSession) -> None:
    # Each request alone would fit in the timeout; together they do not.
    async with fake_upstream(delay=0.15) as fake:
        result = await probe(http, fake.url, {}, timeout=0.4, degraded_ms=THRESHOLD_MS)
    assert result.status == "down"
    assert result.error == "timed out after 0.4 s"
    assert result.latency_ms < 1000


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (401, "HTTP 401 Unauthorized"),
        (500, "HTTP 500 Internal Server Error"),
        (502, "HTTP 502 Bad Gateway"),
    ],
)
async def test_down_on_http_status(status: int, error: str, http: aiohttp.ClientSession) -> None:
    async with fake_upstream(status=status) as fake:
        result = await probe(http, fake.url, {}, timeout=5, degraded_ms=THRESHOLD_MS)
    assert result.status == "down"
    assert result.error == error


async def test_credentials_make_the_difference(http: aiohttp.ClientSession) -> None:
    secret = {"X-Api-Key": "upstream-key"}
    async with fake_upstream(required_headers=secret) as fake:
        without = await probe(http, fake.url, {}, timeout=5, degraded_ms=THRESHOLD_MS)
        fake.requests.clear()
        with_key = await probe(http, fake.url, secret, timeout=5, degraded_ms=THRESHOLD_MS)
    assert without.status == "down"
    assert without.error == "HTTP 401 Unauthorized: missing or wrong credentials"
    assert with_key.status == "healthy"
    assert fake.requests and all(r.headers["X-Api-Key"] == "upstream-key" for r in fake.requests)


async def test_down_on_invalid_response(http: aiohttp.ClientSession) -> None:
    async with fake_upstream(html_body=True) as fake:
        result = await probe(http, fake.url, {}, timeout=5, degraded_ms=THRESHOLD_MS)
    assert result.status == "down"
    assert result.error is not None and result.error.startswith("invalid response")


async def test_down_on_legacy_transport(
    http: aiohttp.ClientSession, sdk_legacy_sse_url: str
) -> None:
    result = await probe(http, sdk_legacy_sse_url, {}, timeout=5, degraded_ms=THRESHOLD_MS)
    assert result.status == "down"
    assert result.error is not None and result.error.startswith("unsupported transport")


@pytest.mark.parametrize(
    ("upstream", "reason"),
    [
        ({"page_bytes": 100 * MiB}, "the tool list exceeds 8 MiB"),
        ({"page_bytes": 100 * MiB, "sse": True}, "the tool list exceeds 8 MiB"),
        ({"page_bytes": 1 * MiB, "pages": 50, "tool_bytes": 8192}, "the tool list exceeds 8 MiB"),
        ({"tool_count": 2001}, "the tool list has more than 2,000 tools"),
    ],
    ids=["100-mb", "100-mb-sse", "many-pages", "2001-tools"],
)
async def test_degraded_when_the_tool_list_is_over_its_bounds(
    upstream: dict[str, int], reason: str, http: aiohttp.ClientSession
) -> None:
    """It answers, so it is not down; but not with a list the gateway will read."""
    memory = ToolListMemory()
    async with hostile_lister(**upstream) as lister:
        result = await probe(
            http, lister.url, {}, timeout=30, degraded_ms=THRESHOLD_MS, memory=memory, owner="w"
        )
    assert result.status == "degraded"
    assert result.error == reason
    assert result.tool_count is None and result.tools_hash is None
    assert memory.in_use == 0
