"""Governed access through the proxy: key scopes, tool patterns, disabled tools and rate limits,
refused MCP-style to the official SDK client and to raw requests, every refusal logged."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson
import pytest
from mcp.shared.exceptions import MCPError

from tests.helpers.api import Api
from tests.helpers.proxying import ACCEPT, Setup, arrange, call, logged_calls, rpc, sdk_client


async def scoped_key(setup: Setup, **rules: Any) -> str:
    reply = await setup.api.post(
        f"/workspaces/{setup.owner.workspace_id}/api-keys",
        json={"name": "scoped", **rules},
        auth=setup.owner,
        expect=201,
    )
    key: str = reply.body["key"]
    return key


async def post(setup: Setup, key: str, message: Any, **headers: str) -> tuple[int, Any, Any]:
    response = await setup.api.client.post(
        f"/api/v1{setup.path}",
        data=orjson.dumps(message),
        headers={"X-API-Key": key, "Accept": ACCEPT, "Content-Type": "application/json", **headers},
    )
    return response.status, orjson.loads(await response.read()), response.headers


async def test_the_sdk_client_sees_only_allowed_tools_and_is_refused_the_others(
    api: Api, db: asyncpg.Connection, sdk_peer: tuple[str, str]
) -> None:
    url, mode = sdk_peer
    setup = await arrange(api, db, url)
    key = await scoped_key(setup, allowed_tools=["add", "ech?"])
    async with sdk_client(setup.url, key, mode) as client:
        listed = await client.list_tools()
        added = await client.call_tool("add", {"a": 1, "b": 2})
        with pytest.raises(MCPError, match="not among this API key's allowed tools"):
            await client.call_tool("fail", {})
    assert sorted(tool.name for tool in listed.tools) == ["add", "echo"]
    assert added.structured_content == {"result": 3}
    rows = await logged_calls(db, 2)
    assert [(r["tool_name"], r["status"]) for r in rows] == [("add", "success"), ("fail", "error")]
    assert (
        rows[1]["error_message"] == "refused: tool 'fail' is not among this API key's allowed tools"
    )


async def test_a_refused_call_is_a_json_rpc_error_to_its_id_and_never_forwarded(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    setup = await arrange(api, db, sdk_stateless)
    key = await scoped_key(setup, allowed_tools=["echo"])
    status, body, _ = await post(setup, key, call("add", rid=41, a=1, b=2))
    assert status == 403
    assert body["id"] == 41 and body["error"]["code"] == -32003
    assert "'add'" in body["error"]["message"]


async def test_a_key_scoped_to_other_servers_is_refused_every_method(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    setup = await arrange(api, db, sdk_stateless)
    other = await arrange(api, db, sdk_stateless)  # another workspace's: just an id here
    mine = await api.post(
        "/servers", json={"name": "mine", "url": sdk_stateless}, auth=setup.owner, expect=201
    )
    key = await scoped_key(setup, allowed_servers=[mine.body["id"]])
    status, body, _ = await post(setup, key, rpc("tools/list"))
    assert (status, body["detail"]) == (403, "this API key may not use this server")
    status, _, _ = await post(setup, key, call("add", a=1, b=1))
    assert status == 403
    rows = await logged_calls(db, 1)
    assert rows[0]["error_message"] == "refused: this API key may not use this server"
    assert other.server_id != mine.body["id"]


async def test_a_key_without_the_proxy_permission_is_refused(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    setup = await arrange(api, db, sdk_stateless)
    key = await scoped_key(setup, permissions=["read"])
    status, body, _ = await post(setup, key, rpc("tools/list"))
    assert (status, body["detail"]) == (403, "this API key does not have the proxy permission")
    await api.get("/servers", auth=key, expect=200)  # it still reads


async def test_over_the_key_s_rate_limit_is_429_with_retry_after(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    setup = await arrange(api, db, sdk_stateless)
    key = await scoped_key(setup, rate_limit="2/hour")
    statuses = []
    for rid in range(1, 4):
        status, body, headers = await post(setup, key, call("add", rid=rid, a=1, b=1))
        statuses.append(status)
    assert statuses == [200, 200, 429]
    assert body == {
        "jsonrpc": "2.0",
        "id": 3,
        "error": {
            "code": -32029,
            "message": "refused by mcp-gateway: this API key's rate limit of 2/hour is reached",
        },
    }
    assert 1 <= int(headers["Retry-After"]) <= 3600
    rows = await logged_calls(db, 3)
    assert rows[2]["error_message"] == "refused: this API key's rate limit of 2/hour is reached"


async def test_a_tools_list_over_sse_is_filtered_and_marked_private(
    api: Api, db: asyncpg.Connection, sdk_sse_url: str
) -> None:
    setup = await arrange(api, db, sdk_sse_url)
    key = await scoped_key(setup, allowed_tools=["echo", "add"])
    async with sdk_client(setup.url, key, "legacy") as client:
        listed = await client.list_tools()
    assert sorted(tool.name for tool in listed.tools) == ["add", "echo"]


async def test_an_mcp_name_header_that_disagrees_with_the_body_is_refused(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    setup = await arrange(api, db, sdk_stateless)
    key = await scoped_key(setup, allowed_tools=["echo"])
    status, body, _ = await post(setup, key, call("echo", text="x"), **{"Mcp-Name": "add"})
    assert (status, body["error"]["code"]) == (400, -32020)


async def test_a_key_without_rules_goes_through_untouched(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    setup = await arrange(api, db, sdk_stateless)
    status, body, _ = await post(setup, setup.key, rpc("tools/list"))
    assert status == 200
    assert "cacheScope" not in body["result"]


async def server_rules(setup: Setup, **rules: Any) -> None:
    await setup.api.patch(f"/servers/{setup.server_id}", json=rules, auth=setup.owner, expect=200)


async def test_a_disabled_tool_is_refused_to_keys_and_members_and_left_out_of_lists(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    setup = await arrange(api, db, sdk_stateless)
    await server_rules(setup, disabled_tools=["fa*"])
    status, body, _ = await post(setup, setup.key, call("fail", rid=5))
    assert (status, body["error"]["code"]) == (403, -32003)
    assert body["error"]["message"].endswith("tool 'fail' is disabled on this server")
    # A member signed in with a JWT is refused alike.
    as_member = await setup.api.post(
        setup.path, json=call("fail"), auth=setup.owner, headers={"Accept": ACCEPT}
    )
    assert as_member.status == 403
    status, body, _ = await post(setup, setup.key, rpc("tools/list"))
    assert status == 200
    assert "fail" not in {tool["name"] for tool in body["result"]["tools"]}
    assert body["result"]["cacheScope"] == "private"
    rows = await logged_calls(db, 2)
    assert {r["error_message"] for r in rows} == {"refused: tool 'fail' is disabled on this server"}


async def test_the_server_s_limit_counts_every_caller_together(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    setup = await arrange(api, db, sdk_stateless)
    other_key = await scoped_key(setup)
    await server_rules(setup, rate_limit="3/hour")
    statuses = [
        (await post(setup, key, call("add", rid=i, a=1, b=1)))[0]
        for i, key in enumerate([setup.key, other_key, setup.key, other_key])
    ]
    assert statuses == [200, 200, 200, 429]
    await server_rules(setup, rate_limit=None)
    assert (await post(setup, other_key, call("add", a=1, b=1)))[0] == 200


async def test_a_key_s_new_scope_applies_to_its_very_next_request(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    setup = await arrange(api, db, sdk_stateless)
    assert (await post(setup, setup.key, call("add", a=1, b=1)))[0] == 200  # cached now
    [key] = (
        await api.get(f"/workspaces/{setup.owner.workspace_id}/api-keys", auth=setup.owner)
    ).body
    await api.patch(
        f"/workspaces/{setup.owner.workspace_id}/api-keys/{key['id']}",
        json={"allowed_tools": ["echo"]},
        auth=setup.owner,
        expect=200,
    )
    assert (await post(setup, setup.key, call("add", a=1, b=1)))[0] == 403


async def test_a_batch_with_a_refused_call_is_refused_whole(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    setup = await arrange(api, db, sdk_stateless)
    key = await scoped_key(setup, allowed_tools=["echo"])
    batch = [call("echo", rid=1, text="x"), call("add", rid=2, a=1, b=2), rpc("ping", rid=3)]
    status, body, _ = await post(setup, key, batch)
    assert status == 403
    # An error for each call that expects an answer; nothing was forwarded.
    assert [(m["id"], m["error"]["code"]) for m in body] == [(1, -32003), (2, -32003)]
    rows = await logged_calls(db, 2)
    assert {r["error_message"] for r in rows} == {
        "refused: tool 'add' is not among this API key's allowed tools"
    }
