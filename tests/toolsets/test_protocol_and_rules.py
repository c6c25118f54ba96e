"""What a toolset's endpoint answers itself (handshake, discovery, ping, notifications, refusals
of what it does not serve), and the rules that apply to its calls as in the proxy."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp import web
from mcp.shared.exceptions import MCPError

from tests.helpers.api import Api
from tests.helpers.proxying import call, logged_calls, recorder, rpc, sdk_client
from tests.helpers.toolsets import arrange_toolset, post, prefix

MODERN = {"MCP-Protocol-Version": "2026-07-28"}
CLIENT = {"name": "t", "version": "1"}
# What a 2026-07-28 request carries in params._meta instead of a handshake.
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": CLIENT,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def initialize(version: str = "2025-06-18") -> dict[str, Any]:
    return rpc("initialize", {"protocolVersion": version, "capabilities": {}, "clientInfo": CLIENT})


def modern_call(name: str, rid: int = 1, **arguments: Any) -> dict[str, Any]:
    return rpc("tools/call", {"name": name, "arguments": arguments, "_meta": ENVELOPE}, rid)


async def test_initialize_issues_a_session_and_negotiates_a_2025_version(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    toolset = await arrange_toolset(api, db, [sdk_stateless])
    status, body, headers = await post(toolset, toolset.key, initialize("2025-03-26"))
    assert status == 200
    assert body["result"]["protocolVersion"] == "2025-03-26"
    assert body["result"]["serverInfo"]["name"] == "agent tools"
    assert body["result"]["capabilities"] == {"tools": {"listChanged": False}}
    session = {"Mcp-Session-Id": headers["Mcp-Session-Id"]}
    status, body, _ = await post(toolset, toolset.key, initialize("1999-01-01"))
    assert body["result"]["protocolVersion"] == "2025-11-25"
    assert (await post(toolset, toolset.key, rpc("ping"), **session))[1]["result"] == {}
    notified = await post(
        toolset, toolset.key, rpc("notifications/initialized", rid=None), **session
    )
    assert (notified[0], notified[1]) == (202, None)


async def test_server_discover_answers_the_2026_era_without_a_session(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    toolset = await arrange_toolset(api, db, [sdk_stateless])
    status, body, headers = await post(
        toolset, toolset.key, rpc("server/discover"), **MODERN, **{"Mcp-Method": "server/discover"}
    )
    assert status == 200
    result = body["result"]
    assert result["supportedVersions"] == ["2026-07-28"]
    assert result["resultType"] == "complete"
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "agent tools"
    assert "Mcp-Session-Id" not in headers


async def test_requests_without_a_session_or_with_another_caller_s_are_refused(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    toolset = await arrange_toolset(api, db, [sdk_stateless])
    status, body, _ = await post(toolset, toolset.key, rpc("tools/list"))
    assert (status, body["error"]["code"]) == (400, -32000)
    _, _, headers = await post(toolset, toolset.key, initialize())
    other_key = await api.api_key(toolset.owner, name="another agent")
    session = {"Mcp-Session-Id": headers["Mcp-Session-Id"]}
    status, body, _ = await post(toolset, other_key, rpc("tools/list"), **session)
    assert (status, body["error"]["message"]) == (404, "Session not found")
    assert (await post(toolset, toolset.key, rpc("tools/list"), **session))[0] == 200


async def test_another_workspace_s_toolset_is_404_and_get_is_405(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    toolset = await arrange_toolset(api, db, [sdk_stateless])
    stranger = await api.signup()
    stranger_key = await api.api_key(stranger)
    status, body, _ = await post(toolset, stranger_key, initialize())
    assert (status, body) == (404, {"detail": "toolset not found"})
    reply = await api.get(toolset.path, auth=toolset.key, headers={"Accept": "text/event-stream"})
    assert reply.status == 405
    assert set(reply.headers["Allow"].split(",")) == {"POST", "DELETE", "OPTIONS"}


async def test_what_a_toolset_does_not_serve_is_answered_in_json_rpc(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    toolset = await arrange_toolset(api, db, [sdk_stateless])
    status, body, _ = await post(toolset, toolset.key, [initialize()])
    assert (status, body["error"]["code"]) == (400, -32600)
    status, body, _ = await post(toolset, toolset.key, rpc("resources/list"), **MODERN)
    assert (status, body["error"]["code"]) == (200, -32601)
    status, body, _ = await post(toolset, toolset.key, call("no_such_tool"), **MODERN)
    assert (status, body["error"]["code"]) == (200, -32602)
    assert body["error"]["message"] == "Unknown tool: no_such_tool"


async def test_an_mcp_name_header_that_disagrees_with_the_body_is_refused(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    toolset = await arrange_toolset(api, db, [sdk_stateless])
    tool = f"{prefix(toolset.names[0])}echo"
    headers = {**MODERN, "Mcp-Method": "tools/call", "Mcp-Name": f"{prefix(toolset.names[0])}add"}
    status, body, _ = await post(toolset, toolset.key, call(tool, text="hi"), **headers)
    assert (status, body["error"]["code"]) == (400, -32020)
    status, body, _ = await post(
        toolset, toolset.key, call(tool, text="hi"), **MODERN, **{"Mcp-Method": "tools/list"}
    )
    assert (status, body["error"]["code"]) == (400, -32020)
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 0


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_key_scopes_and_disabled_tools_apply_to_a_toolset_s_tools(
    api: Api, db: asyncpg.Connection, sdk_stateless: str, sdk_stateful: str, mode: str
) -> None:
    """A key sees, and may call, only tools of the servers it may use, within its allowed
    tools; a refused call is logged. A tool its server disables is not in the toolset."""
    toolset = await arrange_toolset(api, db, [sdk_stateless, sdk_stateful])
    first, second = toolset.servers
    await api.patch(
        f"/servers/{first}", json={"disabled_tools": ["fail"]}, auth=toolset.owner, expect=200
    )
    reply = await api.post(
        f"/workspaces/{toolset.owner.workspace_id}/api-keys",
        json={"name": "scoped", "allowed_servers": [first], "allowed_tools": ["add", "fail"]},
        auth=toolset.owner,
        expect=201,
    )
    key = reply.body["key"]
    own = prefix(toolset.names[0])
    async with sdk_client(toolset.url, key, mode) as client:
        listed = await client.list_tools()
        added = await client.call_tool(f"{own}add", {"a": 1, "b": 2})
        with pytest.raises(MCPError, match="may not use this server"):
            await client.call_tool(f"{prefix(toolset.names[1])}add", {"a": 1, "b": 2})
    assert sorted(tool.name for tool in listed.tools) == [f"{own}add"]
    assert added.structured_content == {"result": 3}
    # A tool the server disables is no part of the toolset: it has no name there.
    status, body, _ = await post(toolset, key, modern_call(f"{own}fail"), **MODERN)
    assert (status, body["error"]["code"]) == (200, -32602)
    rows = await logged_calls(db, 2)
    assert [(str(r["server_id"]), r["tool_name"], r["status"]) for r in rows] == [
        (first, "add", "success"),
        (second, "add", "error"),
    ]
    assert rows[1]["error_message"] == "refused: this API key may not use this server"
    assert {str(r["toolset_id"]) for r in rows} == {toolset.toolset_id}


async def test_over_a_rate_limit_is_429_with_retry_after(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    toolset = await arrange_toolset(api, db, [sdk_stateless])
    await api.patch(
        f"/servers/{toolset.servers[0]}", json={"rate_limit": "2/hour"}, auth=toolset.owner
    )
    tool = f"{prefix(toolset.names[0])}echo"
    answers = [
        await post(toolset, toolset.key, modern_call(tool, rid=i, text="x"), **MODERN)
        for i in range(3)
    ]
    assert [status for status, _, _ in answers] == [200, 200, 429]
    assert answers[2][1]["error"]["code"] == -32029
    assert int(answers[2][2]["Retry-After"]) >= 1


async def test_delete_ends_the_member_sessions(api: Api, db: asyncpg.Connection) -> None:
    async def stateful(request: web.Request) -> web.StreamResponse:
        """A 2025-era server with sessions: no server/discover, a session from initialize."""
        if request.method == "DELETE":
            return web.Response(status=200)
        message = orjson.loads(await request.read())
        if "id" not in message:
            return web.Response(status=202)
        if message["method"] != "initialize":
            error = {"code": -32601, "message": "Method not found"}
            return web.json_response({"jsonrpc": "2.0", "id": message["id"], "error": error})
        result = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": CLIENT}
        return web.json_response(
            {"jsonrpc": "2.0", "id": message["id"], "result": result},
            headers={"Mcp-Session-Id": "member-session-1"},
        )

    async with recorder(script=stateful) as upstream:
        toolset = await arrange_toolset(api, db, [upstream.url])
        status, _, headers = await post(toolset, toolset.key, initialize())
        assert status == 200
        assert headers["Mcp-Session-Id"] != "member-session-1"
        session = {"Mcp-Session-Id": headers["Mcp-Session-Id"]}
        reply = await api.delete(toolset.path, auth=toolset.key, headers=session)
        assert reply.status == 200
        deletes = [h for method, h, _ in upstream.requests if method == "DELETE"]
    assert [h["Mcp-Session-Id"] for h in deletes] == ["member-session-1"]
