"""A toolset's MCP endpoint with the official SDK client, both eras, over three real SDK
servers: merged tool lists under the toolset's names, calls routed to their server and logged
against it, sessions that live inside the session id."""

from __future__ import annotations

import asyncpg
import pytest
from cryptography.fernet import Fernet
from mcp.shared.exceptions import MCPError

from gateway.toolsets.endpoint import TOOLSET_ENDPOINT
from gateway.toolsets.sessions import Sealer
from tests.helpers.api import Api
from tests.helpers.proxying import ACCEPT, logged_calls, rpc, sdk_client
from tests.helpers.toolsets import arrange_toolset, prefix
from tests.helpers.upstreams import unused_url


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_sdk_client_lists_and_calls_through_a_toolset_of_three_servers(
    api: Api,
    db: asyncpg.Connection,
    sdk_stateful: str,
    sdk_stateless: str,
    sdk_sse_url: str,
    mode: str,
) -> None:
    toolset = await arrange_toolset(api, db, [sdk_stateful, sdk_stateless, sdk_sse_url])
    async with sdk_client(toolset.url, toolset.key, mode) as client:
        listed = await client.list_tools()
        names = {tool.name for tool in listed.tools}
        for server_name in toolset.names:
            assert f"{prefix(server_name)}add" in names
        for i in range(3):
            added = await client.call_tool(f"{prefix(toolset.names[i])}add", {"a": i, "b": 40})
            assert added.structured_content == {"result": 40 + i}
    rows = await logged_calls(db, 3)
    assert [str(row["server_id"]) for row in rows] == toolset.servers
    assert {row["tool_name"] for row in rows} == {"add"}
    assert {row["status"] for row in rows} == {"success"}
    assert {str(row["toolset_id"]) for row in rows} == {toolset.toolset_id}


async def test_a_forged_session_id_is_404(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    toolset = await arrange_toolset(api, db, [sdk_stateless])
    reply = await api.post(
        toolset.path,
        json=rpc("tools/list"),
        auth=toolset.key,
        headers={"Accept": ACCEPT, "Mcp-Session-Id": "not-a-session"},
    )
    assert reply.status == 404
    assert reply.body["error"]["message"] == "Session not found"


async def test_a_session_no_longer_valid_is_404_and_a_new_session_works(
    api: Api, db: asyncpg.Connection, sdk_stateful: str
) -> None:
    """Sessions sealed under keys the gateway no longer has are 404: the SDK client (mcp 2.3)
    surfaces "Session not found" rather than initialising again by itself; the client an agent
    opens next works."""
    toolset = await arrange_toolset(api, db, [sdk_stateful])
    tool = f"{prefix(toolset.names[0])}add"
    endpoint = api.app[TOOLSET_ENDPOINT]
    async with sdk_client(toolset.url, toolset.key, "legacy") as client:
        first = await client.call_tool(tool, {"a": 1, "b": 1})
        endpoint.sealer = Sealer((Fernet.generate_key().decode(),))
        with pytest.raises(MCPError, match="Session not found"):
            await client.call_tool(tool, {"a": 2, "b": 2})
    async with sdk_client(toolset.url, toolset.key, "legacy") as client:
        again = await client.call_tool(tool, {"a": 2, "b": 2})
    assert (first.structured_content, again.structured_content) == ({"result": 2}, {"result": 4})


async def test_a_member_that_cannot_be_reached_leaves_only_its_own_tools_out(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    toolset = await arrange_toolset(api, db, [unused_url(), sdk_stateless])
    async with sdk_client(toolset.url, toolset.key, "legacy") as client:
        listed = await client.list_tools()
        added = await client.call_tool(f"{prefix(toolset.names[1])}add", {"a": 1, "b": 2})
    names = {tool.name for tool in listed.tools}
    assert f"{prefix(toolset.names[1])}add" in names
    assert not any(name.startswith(prefix(toolset.names[0])) for name in names)
    assert added.structured_content == {"result": 3}
