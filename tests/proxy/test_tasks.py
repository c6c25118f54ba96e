"""A call that became a task (the tasks extension: the server answers the tools/call with a
task handle, the client polls tasks/get) is one call, logged once, when the reply that ends the
task passes through the gateway (any gateway process), as that reply says; a task no reply
ends is logged when it expires. 2025-11-25's tasks (`{"task": ...}`, tasks/result) too."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
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
    PollingTasks,
    TaskFailed,
    Wire,
    modern,
    send,
    settled,
    watched_client,
)
from tests.helpers.proxying import ACCEPT, Setup, arrange, call, recorder, rpc

AppFactory = Any


def outcomes(rows: list[Any]) -> list[tuple[str, str, str | None]]:
    return [(r["tool_name"], r["status"], r["error_message"]) for r in rows]


async def all_rows(db: asyncpg.Connection, *apis: Api) -> list[Any]:
    """Every row of the log once the gateways have settled (nothing more is on its way)."""
    for api in apis:
        await settled(api)
    return list(await db.fetch("SELECT * FROM tool_calls ORDER BY created_at, id"))


async def followed(db: asyncpg.Connection) -> list[str]:
    return [row[0] for row in await db.fetch("SELECT task_id FROM pending_tasks")]


def job(rid: int, **arguments: Any) -> dict[str, Any]:
    return modern("tools/call", {"name": "job", "arguments": arguments}, rid)


async def until_ended(setup: Setup, task_id: str, rid: int = 100) -> dict[str, Any]:
    """Poll tasks/get (as a client does, at the task's interval) until it leaves `working`."""
    while True:
        state: dict[str, Any] = (await send(setup, modern("tasks/get", {"taskId": task_id}, rid)))[
            "result"
        ]
        if state["status"] != "working":
            return state
        rid += 1
        await asyncio.sleep(state["pollIntervalMs"] / 1000)


# -- the official SDK client and server ---------------------------------------------------------


async def test_a_task_is_one_call_logged_when_a_poll_shows_its_end(
    api: Api, db: asyncpg.Connection, sdk_interactive_json: str
) -> None:
    """Polled until it ends, each task is one row: completed, completed with `isError`, and
    failed with a JSON-RPC error. Its duration spans the task, polling included."""
    setup = await arrange(api, db, sdk_interactive_json)
    wire = Wire()
    async with watched_client(setup, "auto", wire, extensions=[PollingTasks()]) as client:
        done = await client.call_tool("job", {"seconds": 0.3})
        failed = await client.call_tool("job", {"seconds": 0.05, "fail": True})
        with pytest.raises(TaskFailed) as broken:
            await client.call_tool("job", {"seconds": 0.05, "broken": True})
    assert done.content[0].text == "done after 0.3 s"  # type: ignore[union-attr]
    assert failed.is_error and broken.value.state.status == "failed"
    assert len(wire.replies_to("tools/call")) == 3
    assert len(wire.replies_to("tasks/get")) >= 3  # each task polled at least once
    rows = await all_rows(db, api)
    assert outcomes(rows) == [
        ("job", "success", None),
        ("job", "error", failed.content[0].text),  # type: ignore[union-attr]
        ("job", "error", "JSON-RPC error -32603: the job's backend is gone"),
    ]
    # It ran 0.3 s between the tools/call and the poll that saw it end.
    assert rows[0]["duration_ms"] >= 300
    assert await followed(db) == []


async def test_the_end_may_pass_through_another_gateway_process(
    make_api: AppFactory, db: asyncpg.Connection, sdk_interactive_json: str
) -> None:
    """Nothing is kept in one process's memory: the handle passes through one process, the
    polls through another, and the other logs the call."""
    first, second = await make_api(), await make_api()
    setup = await arrange(first, db, sdk_interactive_json)
    other = Setup(second, setup.owner, setup.key, setup.server_id)
    handle = (await send(setup, job(1, seconds=0.05)))["result"]
    assert handle["resultType"] == "task"
    # Stored before the handle was passed on: a poll in any process finds the call.
    assert await followed(db) == [handle["taskId"]]
    state = await until_ended(other, handle["taskId"])
    assert state["status"] == "completed"
    rows = await all_rows(db, first, second)
    assert outcomes(rows) == [("job", "success", None)]
    assert first.app[CALL_LOG].stats.written == 0
    assert second.app[CALL_LOG].stats.written == 1


async def test_a_cancelled_task_is_a_call_cancelled_by_the_caller(
    api: Api, db: asyncpg.Connection, sdk_interactive_json: str
) -> None:
    """tasks/cancel acknowledged ends the call (the client need not poll again); a poll that
    then shows the task cancelled logs nothing more."""
    setup = await arrange(api, db, sdk_interactive_json)
    task_id = (await send(setup, job(1, seconds=30)))["result"]["taskId"]
    ack = await send(setup, modern("tasks/cancel", {"taskId": task_id}, 2))
    assert ack["result"]["resultType"] == "complete"
    state = await until_ended(setup, task_id, rid=3)
    assert state["status"] == "cancelled"
    rows = await all_rows(db, api)
    assert outcomes(rows) == [("job", "error", TASK_CANCELLED)]
    assert await followed(db) == []


async def test_polls_of_a_task_are_no_calls_to_govern(
    api: Api, db: asyncpg.Connection, sdk_interactive_json: str
) -> None:
    """A key allowed one call a minute and one tool makes its call, then polls its task as
    often as it needs: a poll calls no tool."""
    setup = await arrange(api, db, sdk_interactive_json)
    reply = await api.post(
        f"/workspaces/{setup.owner.workspace_id}/api-keys",
        json={"name": "one a minute", "allowed_tools": ["job"], "rate_limit": "1/minute"},
        auth=setup.owner,
        expect=201,
    )
    key = reply.body["key"]
    task_id = (await send(setup, job(1, seconds=0.2), key=key))["result"]["taskId"]
    for rid in range(2, 5):
        state = await send(setup, modern("tasks/get", {"taskId": task_id}, rid), key=key)
        assert state["result"]["taskId"] == task_id
    assert (await until_ended(Setup(api, setup.owner, key, setup.server_id), task_id))[
        "status"
    ] == "completed"
    rows = await all_rows(db, api)
    assert outcomes(rows) == [("job", "success", None)]


async def test_a_task_the_gateway_cannot_follow_is_logged_at_once(
    api: Api,
    db: asyncpg.Connection,
    sdk_interactive_json: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the tasks a workspace may have followed, a call that becomes a task is logged
    when its handle passes, an error saying why; the followed one still ends as it should."""
    monkeypatch.setattr(tasks, "MAX_FOLLOWED", 1)
    setup = await arrange(api, db, sdk_interactive_json)
    kept = (await send(setup, job(1, seconds=0.1)))["result"]["taskId"]
    lost = (await send(setup, job(2, seconds=0.1)))["result"]["taskId"]
    assert await followed(db) == [kept]
    assert (await until_ended(setup, kept))["status"] == "completed"
    assert (await until_ended(setup, lost))["status"] == "completed"
    rows = await all_rows(db, api)
    assert outcomes(rows) == [
        (
            "job",
            "error",
            f"the call became task {lost}, whose end the gateway cannot follow: its "
            "workspace follows 1 tasks already",
        ),
        ("job", "success", None),
    ]


async def test_a_task_whose_end_never_passes_is_logged_when_it_expires(
    api: Api, db: asyncpg.Connection, sdk_interactive_json: str
) -> None:
    setup = await arrange(api, db, sdk_interactive_json)
    task_id = (await send(setup, job(1, seconds=0.05)))["result"]["taskId"]
    expires_at = await db.fetchval("SELECT expires_at FROM pending_tasks")
    # Followed for the handle's TTL (60 s), and at least FOLLOW_AT_LEAST.
    assert timedelta(minutes=59) < expires_at - datetime.now(UTC) <= tasks.FOLLOW_AT_LEAST
    assert await all_rows(db, api) == []
    await db.execute("UPDATE pending_tasks SET expires_at = now() - interval '1 second'")
    done = await run_once(api.app[POOL], api.app[SETTINGS], call_log=api.app[CALL_LOG])
    assert done.expired_tasks == 1 and done.failed == []
    rows = await all_rows(db, api)
    assert outcomes(rows) == [("job", "error", tasks.EXPIRED.format(task_id=task_id))]
    assert rows[0]["duration_ms"] is None
    # Its end passing now logs nothing more.
    assert (await until_ended(setup, task_id))["status"] == "completed"
    assert len(await all_rows(db, api)) == 1


# -- replies as other servers send them ---------------------------------------------------------


def sse(*messages: Any) -> bytes:
    return b"".join(b"event: message\ndata: " + orjson.dumps(m) + b"\n\n" for m in messages)


async def test_a_handle_in_an_sse_reply_is_stored_before_it_is_passed_on(
    api: Api, db: asyncpg.Connection, database_url: str
) -> None:
    """The handle's event reaches the caller only once its task is stored, even while the
    database takes its time (a lock holds the insert up here); a poll's reply that ends the
    task then logs the call."""
    progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
    handle = {"resultType": "task", "taskId": "t-sse", "status": "working", "ttlMs": 5000}

    async def upstream_script(request: web.Request) -> web.StreamResponse:
        message = orjson.loads(await request.read())
        if message["method"] == "tasks/get":
            result = {
                "resultType": "complete",
                "taskId": "t-sse",
                "status": "completed",
                "result": {"content": [{"type": "text", "text": "no luck"}], "isError": True},
            }
            return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": handle}
        await response.write(sse(progress, answer))
        await response.write_eof()
        return response

    async def hold_the_table_a_while(locker: asyncpg.Connection) -> None:
        await asyncio.sleep(0.3)  # a slow database, not a measurement
        await locker.execute("COMMIT")

    async with recorder(script=upstream_script) as upstream:
        setup = await arrange(api, db, upstream.url)
        locker = await asyncpg.connect(database_url)
        try:
            await locker.execute("BEGIN; LOCK TABLE pending_tasks IN EXCLUSIVE MODE")
            release = asyncio.create_task(hold_the_table_a_while(locker))
            async with setup.stream(call("long")) as response:
                assert response.status == 200
                received = b""
                while b"t-sse" not in received:
                    received += await response.content.readany()
                assert await followed(db) == ["t-sse"]
                await response.read()
            await release
        finally:
            await locker.close()
        await api.post(
            setup.path,
            json=rpc("tasks/get", {"taskId": "t-sse"}, 2),
            auth=setup.key,
            headers={"Accept": ACCEPT},
            expect=200,
        )
        rows = await all_rows(db, api)
    assert outcomes(rows) == [("long", "error", "no luck")]


async def test_tasks_of_2025_11_25_end_with_tasks_result(api: Api, db: asyncpg.Connection) -> None:
    """A call that asked for a task (`params.task`) and got `{"task": ...}` is logged when
    tasks/result answers; a tasks/get saying `completed` without the result ends nothing yet.
    A call that did not ask is judged as ever."""
    task = {"taskId": "t-2025", "status": "working", "ttl": 60000, "createdAt": "now"}

    async def upstream_script(request: web.Request) -> web.StreamResponse:
        message = orjson.loads(await request.read())
        rid, method, params = message["id"], message["method"], message["params"]
        if method == "tools/call" and "task" in params:
            result: dict[str, Any] = {"task": task}
        elif method == "tasks/get":
            result = {**task, "status": "completed"}
        else:  # tasks/result, or a call without a task
            result = {"content": [{"type": "text", "text": "the answer"}], "isError": False}
        return web.json_response({"jsonrpc": "2.0", "id": rid, "result": result})

    async with recorder(script=upstream_script) as upstream:
        setup = await arrange(api, db, upstream.url)

        async def post(message: dict[str, Any]) -> Any:
            reply = await api.post(setup.path, json=message, auth=setup.key, expect=200)
            return reply.body

        asked = rpc("tools/call", {"name": "deep", "arguments": {}, "task": {"ttl": 60000}}, 1)
        assert (await post(asked))["result"] == {"task": task}
        assert (await post(rpc("tasks/get", {"taskId": "t-2025"}, 2)))["result"]["status"] == (
            "completed"
        )
        assert await all_rows(db, api) == []
        await post(rpc("tasks/result", {"taskId": "t-2025"}, 3))
        await post(call("shallow", rid=4))
        rows = await all_rows(db, api)
    assert outcomes(rows) == [("deep", "success", None), ("shallow", "success", None)]
    assert await followed(db) == []
