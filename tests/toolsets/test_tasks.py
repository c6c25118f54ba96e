"""Calls through a toolset that became tasks: the toolset routes each request about a task
(tasks/get, tasks/result, tasks/cancel, tasks/update) to the member that holds it, and the call
is logged once, when a reply ends the task (or when it expires), against that member and the
tool's own name, with the toolset's id."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp import web

from gateway.background.retention import run_once
from gateway.calllog.writer import CALL_LOG
from gateway.keys import POOL, SETTINGS
from gateway.proxy import tasks
from gateway.proxy.replies import TASK_CANCELLED
from tests.helpers.api import Api
from tests.helpers.interim import (
    MODERN,
    PollingTasks,
    Wire,
    modern,
    modern_headers,
    send,
    settled,
    watched_client,
)
from tests.helpers.proxying import Setup, add_server, recorder, rpc
from tests.helpers.toolsets import Arranged, arrange_toolset, post, prefix

# What the SDK server's `job` tool says when asked to fail (a result with isError).
FAILED_JOB = "Error executing tool job: the job did not work out"


def outcomes(rows: list[Any]) -> list[tuple[str, str, str, str | None, str | None]]:
    """Each row as (server, tool, status, error, toolset)."""
    return [
        (
            str(r["server_id"]),
            r["tool_name"],
            r["status"],
            r["error_message"],
            None if r["toolset_id"] is None else str(r["toolset_id"]),
        )
        for r in rows
    ]


async def all_rows(db: asyncpg.Connection, api: Api) -> list[Any]:
    """Every row of the log once the gateway has settled (nothing more is on its way)."""
    await settled(api)
    return list(await db.fetch("SELECT * FROM tool_calls ORDER BY created_at, id"))


async def followed(db: asyncpg.Connection) -> list[tuple[str, str, str | None]]:
    rows = await db.fetch("SELECT server_id, task_id, toolset_id FROM pending_tasks")
    return [(str(r[0]), r[1], None if r[2] is None else str(r[2])) for r in rows]


async def ask(toolset: Arranged, message: dict[str, Any], key: str | None = None) -> Any:
    """A 2026-07-28 request to the toolset (Mcp-Method, and Mcp-Name as the spec says); its
    JSON-RPC answer, from JSON or from the SSE event that carries it."""
    params = message["params"]
    name = params.get("name") if message["method"] == "tools/call" else params.get("taskId")
    response = await toolset.api.client.post(
        toolset.path,
        data=orjson.dumps(message),
        headers={"X-API-Key": key or toolset.key, **modern_headers(message["method"], name)},
    )
    body = await response.read()
    if response.headers["Content-Type"].startswith("text/event-stream"):
        for line in body.decode().splitlines():
            if line.startswith("data:") and line[5:].strip():
                data = orjson.loads(line[5:])
                if data.get("id") == message["id"]:
                    return data
        raise AssertionError(f"no response in {body!r}")
    answer = orjson.loads(body)
    assert response.status == 200 or "error" in answer, (response.status, answer)
    return answer


async def until_ended(toolset: Arranged, task_id: str, rid: int = 100) -> dict[str, Any]:
    """Poll tasks/get through the toolset (at the task's interval) until it leaves `working`."""
    while True:
        answer = await ask(toolset, modern("tasks/get", {"taskId": task_id}, rid))
        state: dict[str, Any] = answer["result"]
        if state["status"] != "working":
            return state
        rid += 1
        await asyncio.sleep(state["pollIntervalMs"] / 1000)


def job(toolset: Arranged, member: int, rid: int, **arguments: Any) -> dict[str, Any]:
    name = f"{prefix(toolset.names[member])}job"
    return modern("tools/call", {"name": name, "arguments": arguments}, rid)


# -- the official SDK client --------------------------------------------------------------------


async def test_the_sdk_client_polls_a_toolset_s_task_to_its_end_logged_once(
    api: Api, db: asyncpg.Connection, sdk_interactive_json: str, sdk_stateless: str
) -> None:
    """The SDK client (2026-07-28, with the tasks extension) calls a member's tool that becomes
    a task and polls it through the toolset until it ends: one row, against the member and
    the tool's own name, with the toolset. The other member's calls are as ever."""
    toolset = await arrange_toolset(api, db, [sdk_interactive_json, sdk_stateless])
    tasks_member, other = toolset.servers
    wire = Wire()
    async with watched_client(toolset, "auto", wire, extensions=[PollingTasks()]) as client:
        done = await client.call_tool(f"{prefix(toolset.names[0])}job", {"seconds": 0.2})
        echoed = await client.call_tool(f"{prefix(toolset.names[1])}echo", {"text": "hi"})
    assert done.content[0].text == "done after 0.2 s"  # type: ignore[union-attr]
    assert echoed.content[0].text == "hi"  # type: ignore[union-attr]
    assert len(wire.replies_to("tasks/get")) >= 1
    rows = await all_rows(db, api)
    assert outcomes(rows) == [
        (tasks_member, "job", "success", None, toolset.toolset_id),
        (other, "echo", "success", None, toolset.toolset_id),
    ]
    assert rows[0]["duration_ms"] >= 200  # from the tools/call to the poll that saw its end
    assert await followed(db) == []


# -- by hand: routing, cancelling, unknown tasks, rules -----------------------------------------


async def test_each_task_goes_to_the_member_that_holds_it(
    api: Api, db: asyncpg.Connection, sdk_interactive_json: str, sdk_interactive: str
) -> None:
    """Two members that both make tasks: the handle is stored with its member and the toolset
    before it is passed on, and each task's polls go to its own member."""
    toolset = await arrange_toolset(api, db, [sdk_interactive_json, sdk_interactive])
    first = (await ask(toolset, job(toolset, 0, 1, seconds=0.05)))["result"]
    second = (await ask(toolset, job(toolset, 1, 2, seconds=0.05, fail=True)))["result"]
    assert (first["resultType"], second["resultType"]) == ("task", "task")
    assert sorted(await followed(db)) == sorted(
        [
            (toolset.servers[0], first["taskId"], toolset.toolset_id),
            (toolset.servers[1], second["taskId"], toolset.toolset_id),
        ]
    )
    assert (await until_ended(toolset, second["taskId"]))["status"] == "completed"
    assert (await until_ended(toolset, first["taskId"]))["status"] == "completed"
    rows = await all_rows(db, api)
    assert outcomes(rows) == [
        (toolset.servers[1], "job", "error", FAILED_JOB, toolset.toolset_id),
        (toolset.servers[0], "job", "success", None, toolset.toolset_id),
    ]


async def test_tasks_cancel_through_a_toolset_ends_the_call(
    api: Api, db: asyncpg.Connection, sdk_interactive_json: str, sdk_stateless: str
) -> None:
    """An acknowledged tasks/cancel ends the call (cancelled by the caller). The gateway then
    follows the task no more, so the toolset no longer knows where it lives: a later poll is
    answered as for an unknown task."""
    toolset = await arrange_toolset(api, db, [sdk_interactive_json, sdk_stateless])
    task_id = (await ask(toolset, job(toolset, 0, 1, seconds=30)))["result"]["taskId"]
    ack = await ask(toolset, modern("tasks/cancel", {"taskId": task_id}, 2))
    assert ack["result"]["resultType"] == "complete"
    rows = await all_rows(db, api)
    assert outcomes(rows) == [
        (toolset.servers[0], "job", "error", TASK_CANCELLED, toolset.toolset_id)
    ]
    assert await followed(db) == []
    later = await ask(toolset, modern("tasks/get", {"taskId": task_id}, 3))
    assert later["error"] == {"code": -32602, "message": "Failed to retrieve task: Task not found"}
    assert len(await all_rows(db, api)) == 1


async def test_a_task_the_toolset_s_members_do_not_hold_is_unknown(
    api: Api, db: asyncpg.Connection, sdk_interactive_json: str, sdk_stateless: str
) -> None:
    """-32602 as the tasks extension says a server answers a task it does not know: an id
    nobody issued, and a task of a server outside this toolset (started through its own proxy
    URL); nothing is forwarded or logged. tasks/list (2025-11-25's) is not served."""
    toolset = await arrange_toolset(api, db, [sdk_interactive_json, sdk_stateless])
    outsider = await add_server(api, db, toolset.owner, sdk_interactive_json)
    proxied = Setup(api, toolset.owner, toolset.key, outsider)
    handle = await send(
        proxied, modern("tools/call", {"name": "job", "arguments": {"seconds": 30}})
    )
    elsewhere = handle["result"]["taskId"]
    for rid, (method, task_id, message) in enumerate(
        [
            ("tasks/get", str(uuid.uuid4()), "Failed to retrieve task: Task not found"),
            ("tasks/get", elsewhere, "Failed to retrieve task: Task not found"),
            ("tasks/cancel", elsewhere, "Failed to cancel task: Task not found"),
            ("tasks/result", elsewhere, "Failed to retrieve task: Task not found"),
        ]
    ):
        answer = await ask(toolset, modern(method, {"taskId": task_id}, rid))
        assert answer["error"] == {"code": -32602, "message": message}, method
    version = {"MCP-Protocol-Version": MODERN}
    status, body, _ = await post(toolset, toolset.key, modern("tasks/get", {}), **version)
    assert (status, body["error"]["code"]) == (200, -32602)
    status, body, _ = await post(toolset, toolset.key, modern("tasks/list", {}), **version)
    assert (status, body["error"]["code"]) == (200, -32601)
    # The outsider's task is still followed (for its own proxy URL), and nothing was logged.
    assert await followed(db) == [(outsider, elsewhere, None)]
    assert await all_rows(db, api) == []


async def test_polls_are_governed_as_the_proxy_governs_them(
    api: Api, db: asyncpg.Connection, sdk_interactive_json: str, sdk_stateless: str
) -> None:
    """A poll calls no tool: a key allowed one call a minute polls as often as it needs. A key
    that may not use the member holding the task is refused as a call to it would be (a
    JSON-RPC error to the request, HTTP 403), with no row. An Mcp-Name that is not the task
    id is a header mismatch."""
    toolset = await arrange_toolset(api, db, [sdk_interactive_json, sdk_stateless])
    workspace = toolset.owner.workspace_id
    limited = await api.post(
        f"/workspaces/{workspace}/api-keys",
        json={"name": "one a minute", "rate_limit": "1/minute"},
        auth=toolset.owner,
        expect=201,
    )
    key = limited.body["key"]
    task_id = (await ask(toolset, job(toolset, 0, 1, seconds=0.2), key=key))["result"]["taskId"]
    for rid in range(2, 5):
        answer = await ask(toolset, modern("tasks/get", {"taskId": task_id}, rid), key=key)
        assert answer["result"]["taskId"] == task_id
    scoped = await api.post(
        f"/workspaces/{workspace}/api-keys",
        json={"name": "the other member only", "allowed_servers": [toolset.servers[1]]},
        auth=toolset.owner,
        expect=201,
    )
    response = await api.client.post(
        toolset.path,
        data=orjson.dumps(modern("tasks/get", {"taskId": task_id}, 5)),
        headers={"X-API-Key": scoped.body["key"], **modern_headers("tasks/get", task_id)},
    )
    refused = await response.json()
    assert response.status == 403
    assert refused["id"] == 5
    assert refused["error"] == {
        "code": -32003,
        "message": "refused by mcp-gateway: this API key may not use this server",
    }
    response = await api.client.post(
        toolset.path,
        data=orjson.dumps(modern("tasks/get", {"taskId": task_id}, 6)),
        headers={"X-API-Key": key, **modern_headers("tasks/get", "another-task")},
    )
    assert response.status == 400
    assert (await response.json())["error"]["code"] == -32020
    state = await until_ended(toolset, task_id, rid=7)
    assert state["status"] == "completed"
    rows = await all_rows(db, api)
    assert outcomes(rows) == [(toolset.servers[0], "job", "success", None, toolset.toolset_id)]


async def test_a_toolset_s_task_whose_end_never_passes_is_logged_with_it_when_it_expires(
    api: Api, db: asyncpg.Connection, sdk_interactive_json: str, sdk_stateless: str
) -> None:
    toolset = await arrange_toolset(api, db, [sdk_interactive_json, sdk_stateless])
    task_id = (await ask(toolset, job(toolset, 0, 1, seconds=0.05)))["result"]["taskId"]
    assert await all_rows(db, api) == []
    await db.execute("UPDATE pending_tasks SET expires_at = now() - interval '1 second'")
    done = await run_once(api.app[POOL], api.app[SETTINGS], call_log=api.app[CALL_LOG])
    assert done.expired_tasks == 1 and done.failed == []
    rows = await all_rows(db, api)
    assert outcomes(rows) == [
        (
            toolset.servers[0],
            "job",
            "error",
            tasks.EXPIRED.format(task_id=task_id),
            toolset.toolset_id,
        )
    ]


async def test_a_toolset_s_task_the_gateway_cannot_follow_is_logged_with_it_at_once(
    api: Api,
    db: asyncpg.Connection,
    sdk_interactive_json: str,
    sdk_stateless: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tasks, "MAX_FOLLOWED", 0)
    toolset = await arrange_toolset(api, db, [sdk_interactive_json, sdk_stateless])
    task_id = (await ask(toolset, job(toolset, 0, 1, seconds=0.05)))["result"]["taskId"]
    rows = await all_rows(db, api)
    assert outcomes(rows) == [
        (
            toolset.servers[0],
            "job",
            "error",
            f"the call became task {task_id}, whose end the gateway cannot follow: its "
            "workspace follows 0 tasks already",
            toolset.toolset_id,
        )
    ]


# -- 2025-11-25's tasks, through a client's session ----------------------------------------------


async def test_a_2025_session_s_task_ends_with_tasks_result_through_the_member_s_session(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    """A 2025-era client's call that asks for a task (`params.task`) and gets `{"task": ...}`
    is followed; its tasks/get and tasks/result go to the member within the member session
    the client's session holds, and tasks/result ends the call."""
    task = {"taskId": "t-2025", "status": "working", "ttl": 60000, "createdAt": "now"}
    deep = {"name": "deep", "inputSchema": {"type": "object"}}

    async def member(request: web.Request) -> web.StreamResponse:
        if request.method == "DELETE":
            return web.Response(status=200)
        message = orjson.loads(await request.read())
        if "id" not in message:
            return web.Response(status=202)
        rid, method = message["id"], message["method"]
        params = message.get("params") or {}
        result: dict[str, Any]
        if method == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {}}
            return web.json_response(
                {"jsonrpc": "2.0", "id": rid, "result": result},
                headers={"Mcp-Session-Id": "member-session-1"},
            )
        if method == "tools/list":
            result = {"tools": [deep]}
        elif method == "tools/call" and "task" in params:
            result = {"task": task}
        elif method == "tasks/get":
            result = {**task, "status": "completed"}
        elif method == "tasks/result":
            result = {"content": [{"type": "text", "text": "the answer"}], "isError": False}
        else:
            error = {"code": -32601, "message": "Method not found"}
            return web.json_response({"jsonrpc": "2.0", "id": rid, "error": error})
        return web.json_response({"jsonrpc": "2.0", "id": rid, "result": result})

    async with recorder(script=member) as upstream:
        toolset = await arrange_toolset(api, db, [upstream.url, sdk_stateless])
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}}
        _, _, headers = await post(toolset, toolset.key, rpc("initialize", hello))
        session = {
            "Mcp-Session-Id": headers["Mcp-Session-Id"],
            "MCP-Protocol-Version": "2025-11-25",
        }
        name = f"{prefix(toolset.names[0])}deep"
        asked = rpc("tools/call", {"name": name, "arguments": {}, "task": {"ttl": 60000}}, 1)
        assert (await post(toolset, toolset.key, asked, **session))[1]["result"] == {"task": task}
        polled = await post(
            toolset, toolset.key, rpc("tasks/get", {"taskId": "t-2025"}, 2), **session
        )
        assert polled[1]["result"]["status"] == "completed"
        assert await all_rows(db, api) == []  # completed, but its result comes with tasks/result
        answered = await post(
            toolset, toolset.key, rpc("tasks/result", {"taskId": "t-2025"}, 3), **session
        )
        assert answered[1]["result"]["content"][0]["text"] == "the answer"
        rows = await all_rows(db, api)
        sent = [
            (orjson.loads(body)["method"], headers.get("Mcp-Session-Id"))
            for verb, headers, body in upstream.requests
            if verb == "POST" and orjson.loads(body)["method"].startswith("tasks/")
        ]
    assert sent == [("tasks/get", "member-session-1"), ("tasks/result", "member-session-1")]
    assert outcomes(rows) == [(toolset.servers[0], "deep", "success", None, toolset.toolset_id)]
    assert await followed(db) == []
