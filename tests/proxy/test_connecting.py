"""Connecting an agent as the dashboard's "Connect an agent" panel says: the API key as a
bearer token (official SDK client, mcp-remote through npx, the panel's Python snippet run as
it is), 401s that say what to send, and OAuth discovery answered in JSON, not HTML."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx2
import orjson
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from gateway.api.discovery import no_oauth
from gateway.app import create_app
from gateway.config import Settings
from gateway.dashboard.connect import KEY_PLACEHOLDER, snippets
from gateway.keys import SETTINGS
from tests.helpers.api import Api
from tests.helpers.npx import npx_for
from tests.helpers.proxying import ACCEPT, arrange, logged_calls, rpc
from tests.helpers.upstreams import free_port

SAY_WHAT_TO_SEND = "send your API key as 'Authorization: Bearer mcpg_…' or 'X-API-Key: mcpg_…'"


async def outside_the_api(
    api: Api, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, str, dict[str, str], bytes]:
    """A request to a path as it is (Api.request puts bare paths under /api/v1)."""
    async with api.client.request(method, path, headers=headers) as response:
        return response.status, response.content_type, dict(response.headers), await response.read()


def snippet(name: str, url: str, title: str) -> str:
    [found] = [s.text for s in snippets(name, url) if s.title == title]
    return found


# -- the API key as a bearer token -------------------------------------------------------------


async def test_sdk_client_with_the_key_as_a_bearer_token(
    api: Api, db: asyncpg.Connection, sdk_stateful: str
) -> None:
    setup = await arrange(api, db, sdk_stateful)
    headers = {"Authorization": f"Bearer {setup.key}", "X-Caller-Agent": "bearer-agent"}
    http = httpx2.AsyncClient(headers=headers, timeout=30)
    async with http, Client(streamable_http_client(setup.url, http_client=http)) as client:
        tools = await client.list_tools()
        added = await client.call_tool("add", {"a": 2, "b": 40})
    assert "add" in {tool.name for tool in tools.tools}
    assert added.structured_content == {"result": 42}
    [row] = await logged_calls(db, 1)
    assert (row["tool_name"], row["status"]) == ("add", "success")
    assert row["caller_agent"] == "bearer-agent"
    assert str(row["server_id"]) == setup.server_id


async def test_the_panels_python_snippet_runs_as_shown(
    api: Api, db: asyncpg.Connection, sdk_stateful: str, tmp_path: Path
) -> None:
    """The snippet, with only the placeholder replaced by a key, lists the server's tools."""
    setup = await arrange(api, db, sdk_stateful)
    code = snippet("tools", setup.url, "Python (the mcp SDK)").replace(KEY_PLACEHOLDER, setup.key)
    script = tmp_path / "agent.py"
    script.write_text(code)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode(errors="replace")[-3000:]
    assert "'add'" in out.decode()


async def test_claude_desktop_through_mcp_remote(
    api: Api, db: asyncpg.Connection, sdk_stateful: str, tmp_path: Path
) -> None:
    """The panel's claude_desktop_config.json entry, run as Claude Desktop runs it: npx
    mcp-remote on stdio (driven here by the SDK's stdio client), the key in AUTH_HEADER."""
    npx = await npx_for("mcp-remote")
    setup = await arrange(api, db, sdk_stateful)
    config = orjson.loads(snippet("tools", setup.url, "Claude Desktop"))
    [entry] = config["mcpServers"].values()
    assert entry["command"] == "npx"
    env = {
        **os.environ,
        **entry["env"],
        # mcp-remote keeps its state (OAuth tokens it never needs here) in this folder.
        "MCP_REMOTE_CONFIG_DIR": str(tmp_path),
    }
    env["AUTH_HEADER"] = env["AUTH_HEADER"].replace(KEY_PLACEHOLDER, setup.key)
    server = StdioServerParameters(command=npx, args=entry["args"], env=env)

    async def session() -> None:
        # Claude Desktop speaks the handshake era of the protocol.
        async with Client(server, mode="legacy") as client:
            tools = await client.list_tools()
            assert "add" in {tool.name for tool in tools.tools}
            added = await client.call_tool("add", {"a": 20, "b": 22})
            assert added.structured_content == {"result": 42}

    # The first run downloads mcp-remote from the npm registry.
    await asyncio.wait_for(session(), timeout=300)
    [row] = await logged_calls(db, 1)
    assert (row["tool_name"], row["status"]) == ("add", "success")


# -- refusals that say what to send ------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "authentication required"),
        ({"X-API-Key": "mcpg_" + "x" * 43}, "invalid or revoked API key"),
        ({"Authorization": "Bearer mcpg_" + "x" * 43}, "invalid or revoked API key"),
        ({"Authorization": "Bearer not-a-token"}, "invalid access token"),
        (
            {"Authorization": "mcpg_" + "x" * 43},
            "the Authorization header must be 'Bearer <token>'",
        ),
    ],
)
async def test_a_refused_mcp_request_says_in_one_line_what_to_send(
    api: Api, db: asyncpg.Connection, headers: dict[str, str], reason: str
) -> None:
    setup = await arrange(api, db, "http://127.0.0.1:9/mcp")
    reply = await api.post(
        setup.path,
        json=rpc("initialize", {}),
        headers={"Accept": ACCEPT, **headers},
        expect=401,
    )
    assert reply.body == {"detail": f"{reason}: {SAY_WHAT_TO_SEND}"}
    assert reply.headers["WWW-Authenticate"] == "Bearer"


async def test_the_rest_of_the_api_keeps_its_own_401s(api: Api) -> None:
    reply = await api.get("/servers", expect=401)
    assert reply.detail == (
        "authentication required: send 'Authorization: Bearer <access token>' "
        "or an API key as 'X-API-Key'"
    )
    reply = await api.get("/servers", headers={"Authorization": "Bearer nope"}, expect=401)
    assert reply.detail == "invalid access token"


# -- OAuth discovery: JSON, saying the gateway takes API keys ----------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/.well-known/oauth-protected-resource"),
        ("GET", "/.well-known/oauth-protected-resource/api/v1/proxy/{server_id}/mcp"),
        ("GET", "/.well-known/oauth-authorization-server"),
        ("GET", "/.well-known/oauth-authorization-server/api/v1/proxy/{server_id}/mcp"),
        ("GET", "/.well-known/oauth-client-metadata"),
        ("GET", "/.well-known/openid-configuration"),
        ("GET", "/.well-known/openid-configuration/api/v1/proxy/{server_id}/mcp"),
        ("GET", "/api/v1/proxy/{server_id}/mcp/.well-known/openid-configuration"),
        ("POST", "/register"),
        ("POST", "/token"),
    ],
)
async def test_oauth_discovery_gets_a_json_404_naming_api_keys(
    api: Api, db: asyncpg.Connection, method: str, path: str
) -> None:
    setup = await arrange(api, db, "http://127.0.0.1:9/mcp")
    status, kind, _, body = await outside_the_api(
        api, method, path.format(server_id=setup.server_id)
    )
    assert (status, kind) == (404, "application/json")
    if path.startswith("/api/"):
        assert orjson.loads(body) == {"detail": "not found"}  # the API's own 404, JSON already
    else:
        # OAuth is off: the test PUBLIC_URL is plain http, not loopback.
        detail = no_oauth(api.app[SETTINGS])
        assert detail is not None and orjson.loads(body) == {"detail": detail}
        assert "\n" not in detail and "Authorization: Bearer mcpg_" in detail


async def test_a_browser_client_may_read_the_discovery_answer(api: Api) -> None:
    path = "/.well-known/oauth-protected-resource"
    origin = {"Origin": "http://localhost:6274"}  # the Inspector's web UI
    preflight = {**origin, "Access-Control-Request-Method": "GET"}
    status, _, headers, _ = await outside_the_api(api, "OPTIONS", path, preflight)
    assert (status, headers["Access-Control-Allow-Origin"]) == (204, "*")
    status, _, headers, _ = await outside_the_api(api, "GET", path, origin)
    assert (status, headers["Access-Control-Allow-Origin"]) == (404, "*")


async def test_other_unknown_pages_stay_pages(api: Api) -> None:
    status, kind, _, _ = await outside_the_api(api, "GET", "/.well-known/security.txt")
    assert (status, kind) == (404, "text/html")


# -- the README's curl session -----------------------------------------------------------------


def readme_session() -> str:
    """The bash block of the README's "Connecting an agent" section."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("## Connecting an agent", 1)[1]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


async def test_the_readmes_curl_session_runs_as_written(
    settings: Settings,
    aiohttp_client: Callable[..., Awaitable[Any]],
    db: asyncpg.Connection,
    sdk_stateful: str,
) -> None:
    """Against a gateway whose PUBLIC_URL is its own address, with the README's example server
    replaced by an official SDK server: every step answers, and the call is logged."""
    if shutil.which("curl") is None:
        pytest.skip("needs curl (apt-get install curl)")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    app = create_app(settings.replace(public_url=base))
    await aiohttp_client(app, server_kwargs={"port": port})
    script = readme_session()
    assert "GW=http://127.0.0.1:8080\n" in script and "https://mcp.example.com/mcp" in script
    script = script.replace("GW=http://127.0.0.1:8080\n", f"GW={base}\n")
    script = script.replace("https://mcp.example.com/mcp", sdk_stateful)
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        script,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    output = out.decode()
    assert process.returncode == 0, err.decode()[-3000:]
    # tools/list, then the tools/call's result, each an SSE event from the SDK server.
    assert '"name":"add"' in output
    assert '"structuredContent":{"result":42}' in output
    [row] = await logged_calls(db, 1)
    assert (row["tool_name"], row["status"]) == ("add", "success")
