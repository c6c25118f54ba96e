"""Tool integrity, pinning: a server that pins its tools serves only those whose definition is
the approved one, through the proxy and through toolsets; approving one tool or all of them
lets them through again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson
import pytest

from tests.helpers.api import Account, Api
from tests.helpers.integrity import changes, edited, probe, recorded, register
from tests.helpers.proxying import ACCEPT, call, logged_calls, rpc
from tests.helpers.toolsets import arrange_toolset, post, prefix
from tests.helpers.upstreams import FakeUpstream, fake_upstream
from tests.helpers.waiting import eventually

# A 2026-07-28 client: a toolset serves it without a session.
MODERN = {"MCP-Protocol-Version": "2026-07-28"}


@dataclass
class Pinned:
    api: Api
    admin: Account
    key: str
    fake: FakeUpstream
    server_id: str
    session: str = ""

    async def send(self, message: Any) -> tuple[int, Any]:
        headers = {"X-API-Key": self.key, "Accept": ACCEPT, "Content-Type": "application/json"}
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        response = await self.api.client.post(
            f"/api/v1/proxy/{self.server_id}/mcp", data=orjson.dumps(message), headers=headers
        )
        if "Mcp-Session-Id" in response.headers:
            self.session = response.headers["Mcp-Session-Id"]
        return response.status, orjson.loads(await response.read())

    async def listed(self) -> list[str]:
        status, body = await self.send(rpc("tools/list", rid=7))
        assert status == 200, body
        return sorted(tool["name"] for tool in body["result"]["tools"])

    async def approve(self, body: dict[str, Any], expect: int = 200) -> Any:
        reply = await self.api.post(
            f"/servers/{self.server_id}/tools/approve", json=body, auth=self.admin, expect=expect
        )
        return reply.body


@pytest.fixture
async def pinned(api: Api) -> AsyncIterator[Pinned]:
    """A server seen once, then pinned (which approves what it lists), with an MCP session."""
    admin = await api.signup()
    key = await api.api_key(admin)
    async with fake_upstream() as fake:
        server_id = await register(api, admin, fake.url)
        await probe(api, admin, server_id)
        await api.patch(f"/servers/{server_id}", json={"pin_tools": True}, auth=admin, expect=200)
        setup = Pinned(api, admin, key, fake, server_id)
        await setup.send(rpc("initialize", {}))
        yield setup


async def changed_and_seen(pinned: Pinned, *names: str) -> None:
    for name in names:
        pinned.fake.tools = edited(pinned.fake.tools, name, description=f"{name}, now evil")
    await probe(pinned.api, pinned.admin, pinned.server_id)


async def refused(pinned: Pinned, name: str) -> bool:
    status, _ = await pinned.send(call(name, x="1"))
    return status == 403


async def test_turning_pinning_on_approves_what_the_server_lists(pinned: Pinned) -> None:
    assert (await pinned.api.get(f"/servers/{pinned.server_id}", auth=pinned.admin)).body[
        "pin_tools"
    ]
    assert await pinned.listed() == ["alpha", "bravo", "charlie", "delta", "echo"]
    status, body = await pinned.send(call("alpha", x="1"))
    assert status == 200 and body["result"]["isError"] is False


async def test_a_changed_tool_is_refused_and_left_out_of_tools_list(
    pinned: Pinned, db: asyncpg.Connection
) -> None:
    await changed_and_seen(pinned, "bravo")
    # The change reaches the proxy's cached server by NOTIFY.
    await eventually(lambda: refused(pinned, "bravo"))
    forwarded = len(pinned.fake.requests)
    status, body = await pinned.send(call("bravo", rid=9, x="1"))
    assert status == 403
    assert body["id"] == 9 and body["error"]["code"] == -32003
    assert "'bravo'" in body["error"]["message"]
    assert len(pinned.fake.requests) == forwarded  # never reached the server
    # The others still go through.
    status, _ = await pinned.send(call("alpha", x="1"))
    assert status == 200
    status, listing = await pinned.send(rpc("tools/list", rid=7))
    assert sorted(t["name"] for t in listing["result"]["tools"]) == [
        "alpha",
        "charlie",
        "delta",
        "echo",
    ]
    assert listing["result"]["cacheScope"] == "private"
    # The rows are written in the background; alpha's call was the last.
    await until_logged(db, "alpha")
    rows = await db.fetch("SELECT * FROM tool_calls")
    # (Calls sent before the NOTIFY arrived went through: only the refusals are errors.)
    refusals = [r for r in rows if r["tool_name"] == "bravo" and r["status"] == "error"]
    assert len(refusals) >= 2
    assert all(r["error_message"].startswith("refused: tool 'bravo'") for r in refusals)


async def test_a_new_tool_waits_for_approval(pinned: Pinned) -> None:
    tool = {"name": "foxtrot", "description": "new", "inputSchema": {"type": "object"}}
    pinned.fake.tools = [*pinned.fake.tools, tool]
    await probe(pinned.api, pinned.admin, pinned.server_id)
    await until_listed_without(pinned, "foxtrot")
    assert await refused(pinned, "foxtrot")
    [item] = (await changes(pinned.api, pinned.admin, pinned.server_id))["items"]
    assert (item["tool_name"], item["change"]) == ("foxtrot", "added")


async def until_logged(db: asyncpg.Connection, tool: str) -> None:
    async def logged() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM tool_calls WHERE tool_name = $1", tool))

    await eventually(logged)


async def until_listed_without(pinned: Pinned, name: str) -> None:
    async def gone() -> bool:
        return name not in await pinned.listed()

    await eventually(gone)


async def test_approving_one_tool_lets_it_through_and_leaves_the_others_waiting(
    pinned: Pinned,
) -> None:
    await changed_and_seen(pinned, "bravo", "charlie")
    await until_listed_without(pinned, "charlie")
    answer = await pinned.approve({"tools": ["bravo"]})
    assert answer == {"approved": ["bravo"], "waiting": ["charlie"]}
    # This process forgets its cached server at once.
    assert not await refused(pinned, "bravo")
    assert await refused(pinned, "charlie")
    assert await pinned.listed() == ["alpha", "bravo", "delta", "echo"]


async def test_approving_all_lets_every_tool_through(pinned: Pinned) -> None:
    await changed_and_seen(pinned, "bravo", "charlie")
    pinned.fake.tools = [tool for tool in pinned.fake.tools if tool["name"] != "echo"]
    await probe(pinned.api, pinned.admin, pinned.server_id)
    await until_listed_without(pinned, "charlie")
    answer = await pinned.approve({})
    assert answer == {"approved": ["alpha", "bravo", "charlie", "delta"], "waiting": []}
    assert await pinned.listed() == ["alpha", "bravo", "charlie", "delta"]
    assert not await refused(pinned, "charlie")


async def test_a_tool_changed_after_approval_is_refused_again(pinned: Pinned) -> None:
    await changed_and_seen(pinned, "bravo")
    await until_listed_without(pinned, "bravo")
    await pinned.approve({"tools": ["bravo"]})
    assert not await refused(pinned, "bravo")
    pinned.fake.tools = edited(pinned.fake.tools, "bravo", description="and again")
    await probe(pinned.api, pinned.admin, pinned.server_id)
    await eventually(lambda: refused(pinned, "bravo"))


async def test_approving_a_tool_the_server_does_not_list_is_422_and_approves_nothing(
    pinned: Pinned,
) -> None:
    await changed_and_seen(pinned, "bravo")
    body = await pinned.approve({"tools": ["bravo", "nonexistent"]}, expect=422)
    assert body["detail"].startswith("body.tools:") and "'nonexistent'" in body["detail"]
    bad: dict[str, Any]
    for bad in ({"tools": []}, {"tools": "bravo"}, {"tools": [""]}, {"names": ["bravo"]}):
        detail = (await pinned.approve(bad, expect=422))["detail"]
        assert detail.startswith("body"), detail
    await until_listed_without(pinned, "bravo")
    assert await refused(pinned, "bravo")


async def test_only_admins_approve(pinned: Pinned) -> None:
    await pinned.api.post(
        f"/servers/{pinned.server_id}/tools/approve", json={}, auth=pinned.key, expect=403
    )


async def test_a_server_that_does_not_pin_serves_changed_tools(api: Api) -> None:
    admin = await api.signup()
    key = await api.api_key(admin)
    async with fake_upstream() as fake:
        server_id = await register(api, admin, fake.url)
        await probe(api, admin, server_id)
        setup = Pinned(api, admin, key, fake, server_id)
        await setup.send(rpc("initialize", {}))
        await changed_and_seen(setup, "bravo")
        assert not await refused(setup, "bravo")
        assert "bravo" in await setup.listed()


async def test_pinning_holds_through_a_toolset(api: Api, db: asyncpg.Connection) -> None:
    async with fake_upstream() as fake:
        toolset = await arrange_toolset(api, db, [fake.url])
        server_id = toolset.servers[0]
        await probe(api, toolset.owner, server_id)
        await api.patch(
            f"/servers/{server_id}", json={"pin_tools": True}, auth=toolset.owner, expect=200
        )
        fake.tools = edited(fake.tools, "bravo", description="now evil")
        await probe(api, toolset.owner, server_id)
        name = prefix(toolset.names[0]) + "bravo"

        async def listed() -> list[str]:
            status, body, _ = await post(toolset, toolset.key, rpc("tools/list", rid=3), **MODERN)
            assert status == 200, body
            return [tool["name"] for tool in body["result"]["tools"]]

        async def shown() -> bool:
            return name in await listed()

        async def hidden() -> bool:
            return not await shown()

        await eventually(hidden)
        status, body, _ = await post(toolset, toolset.key, call(name, rid=4, x="1"), **MODERN)
        assert status == 403 and body["error"]["code"] == -32003
        assert prefix(toolset.names[0]) + "alpha" in await listed()
        rows = await logged_calls(db, 1)
        assert rows[0]["error_message"].startswith("refused: tool 'bravo'")
        assert str(rows[0]["toolset_id"]) == toolset.toolset_id
        await api.post(
            f"/servers/{server_id}/tools/approve",
            json={"tools": ["bravo"]},
            auth=toolset.owner,
            expect=200,
        )
        await eventually(shown)
        status, body, _ = await post(toolset, toolset.key, call(name, rid=5, x="1"), **MODERN)
        assert status == 200, body
        await recorded(api)
