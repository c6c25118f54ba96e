"""What the call log records of proxied traffic: each tools/call's outcome as MCP reports it,
who ended an exchange cut short, every spelling of a call, and text no caller can poison."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
from aiohttp import web
from mcp.shared.exceptions import MCPError

from gateway.calllog.writer import CALL_LOG
from gateway.proxy.outcome import CALLER_HUNG_UP
from gateway.proxy.replies import CALLER_CANCELLED
from tests.helpers.api import Api
from tests.helpers.proxying import ACCEPT, arrange, call, logged_calls, recorder, rpc, sdk_client

AppFactory = Callable[..., Awaitable[Api]]


def outcomes(rows: list[Any]) -> list[tuple[str, str, str | None]]:
    return [(r["tool_name"], r["status"], r["error_message"]) for r in rows]


# -- the official SDK client and server ---------------------------------------------------------


async def test_sdk_traffic_is_logged_as_it_went(
    api: Api, db: asyncpg.Connection, sdk_peer: tuple[str, str]
) -> None:
    """200 successful calls are 200 successes, however early the SDK client closes each
    response; a tool that raises and a call with bad arguments are errors with the server's
    own words."""
    url, mode = sdk_peer
    setup = await arrange(api, db, url)
    async with sdk_client(setup.url, setup.key, mode) as client:
        for i in range(200):
            result = await client.call_tool("echo", {"text": f"call {i}"})
            assert not result.is_error
        failed = await client.call_tool("fail", {})
        bad = await client.call_tool("add", {"a": "not a number", "b": 1})
    assert failed.is_error and bad.is_error
    rows = await logged_calls(db, 202)
    assert outcomes(rows[:200]) == [("echo", "success", None)] * 200
    assert outcomes(rows[200:]) == [
        ("fail", "error", failed.content[0].text),  # type: ignore[union-attr]
        ("add", "error", bad.content[0].text),  # type: ignore[union-attr]
    ]
    assert "validation error" in rows[201]["error_message"]


async def test_a_call_the_sdk_client_gives_up_on_is_cancelled_by_the_caller(
    api: Api, db: asyncpg.Connection, sdk_peer: tuple[str, str]
) -> None:
    url, mode = sdk_peer
    setup = await arrange(api, db, url)
    async with sdk_client(setup.url, setup.key, mode) as client:
        with pytest.raises(MCPError, match="timed out"):
            await client.call_tool("slow", {"seconds": 1.0}, read_timeout_seconds=0.2)
        echoed = await client.call_tool("echo", {"text": "still here"})
        assert not echoed.is_error
    rows = await logged_calls(db, 2, within=15)
    by_tool = {r["tool_name"]: r for r in rows}
    assert by_tool["slow"]["status"] == "error"
    # A 2025-era server confirms the cancellation in the response (-32800); with 2026-07-28
    # nothing answers and the client hangs up.
    assert by_tool["slow"]["error_message"].startswith(CALLER_CANCELLED)
    assert by_tool["echo"]["status"] == "success"


# -- outcomes in JSON and SSE replies ----------------------------------------------------------


def rpc_reply(rid: Any, **fields: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, **fields}


def tool_result(text: str, *, failed: bool) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": failed}


async def answer_by_name(request: web.Request) -> web.StreamResponse:
    """JSON replies: the tool named `rpc-error` gets a JSON-RPC error, `broken` an isError
    result, anything else a result; a batch gets a batch."""
    body = orjson.loads(await request.read())

    def one(message: dict[str, Any]) -> dict[str, Any]:
        name = message["params"]["name"]
        if name == "rpc-error":
            return rpc_reply(message["id"], error={"code": -32602, "message": "Unknown tool"})
        return rpc_reply(
            message["id"], result=tool_result(f"{name} said so", failed=name == "broken")
        )

    answer = [one(m) for m in body] if isinstance(body, list) else one(body)
    return web.Response(body=orjson.dumps(answer), content_type="application/json")


async def test_json_replies_decide_each_call(api: Api, db: asyncpg.Connection) -> None:
    async with recorder(script=answer_by_name) as upstream:
        setup = await arrange(api, db, upstream.url)
        for name in ("fine", "broken", "rpc-error"):
            await api.post(setup.path, json=call(name), auth=setup.key, expect=200)
        batch = [call("fine", 1), call("broken", 2), call("rpc-error", 3)]
        reply = await api.post(setup.path, json=batch, auth=setup.key, expect=200)
        assert len(reply.body) == 3
    rows = await logged_calls(db, 6)
    expected = [
        ("fine", "success", None),
        ("broken", "error", "broken said so"),
        ("rpc-error", "error", "JSON-RPC error -32602: Unknown tool"),
    ]
    assert outcomes(rows[:3]) == expected
    assert sorted(outcomes(rows[3:])) == sorted(expected)


async def test_an_http_error_says_the_json_rpc_error_too(api: Api, db: asyncpg.Connection) -> None:
    async def refused(request: web.Request) -> web.StreamResponse:
        error = {"code": -32600, "message": "Bad Request: Missing session ID"}
        return web.json_response(rpc_reply(None, error=error), status=400)

    async with recorder(script=refused) as upstream:
        setup = await arrange(api, db, upstream.url)
        await api.post(setup.path, json=call("x"), auth=setup.key, expect=400)
    [row] = await logged_calls(db, 1)
    assert outcomes([row]) == [
        (
            "x",
            "error",
            "upstream answered HTTP 400: JSON-RPC error -32600: Bad Request: Missing session ID",
        )
    ]


def event(message: Any, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: message\ndata: {orjson.dumps(message).decode()}\n\n".encode()


PROGRESS = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}


async def test_sse_the_response_after_notifications_decides(
    api: Api, db: asyncpg.Connection
) -> None:
    async def streamed(request: web.Request) -> web.StreamResponse:
        message = orjson.loads(await request.read())
        failed = message["params"]["name"] == "broken"
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        stream = event(PROGRESS) + event(
            rpc_reply(message["id"], result=tool_result("disk full", failed=failed))
        )
        for i in range(0, len(stream), 13):  # events split across chunks
            await response.write(stream[i : i + 13])
            await asyncio.sleep(0)
        await response.write_eof()
        return response

    async with recorder(script=streamed) as upstream:
        setup = await arrange(api, db, upstream.url)
        for name in ("fine", "broken"):
            reply = await api.post(
                setup.path, json=call(name), auth=setup.key, headers={"Accept": ACCEPT}
            )
            assert reply.status == 200 and reply.body.count("event: message") == 2
    rows = await logged_calls(db, 2)
    assert outcomes(rows) == [("fine", "success", None), ("broken", "error", "disk full")]


async def test_a_stream_ended_without_the_response_is_an_error_unless_resumable(
    api: Api, db: asyncpg.Connection
) -> None:
    async def unanswered(request: web.Request) -> web.StreamResponse:
        message = orjson.loads(await request.read())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        # With an event id the client may resume the stream with a GET (2025-11-25 polling).
        resumable = message["params"]["name"] == "polled"
        await response.write(event(PROGRESS, 1 if resumable else None))
        await response.write_eof()
        return response

    async with recorder(script=unanswered) as upstream:
        setup = await arrange(api, db, upstream.url)
        for name in ("lost", "polled"):
            await api.post(setup.path, json=call(name), auth=setup.key, expect=200)
    rows = await logged_calls(db, 2)
    assert outcomes(rows) == [
        ("lost", "error", "the upstream's reply holds no response to this call"),
        ("polled", "success", None),
    ]


# -- who ended an exchange cut short -----------------------------------------------------------


def gateway_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("gateway") and r.levelno >= logging.WARNING
    ]


async def test_hanging_up_after_the_response_is_not_an_error(
    api: Api, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """Like the SDK client: it closes the stream once the response event is in."""
    go_on = asyncio.Event()

    async def lingering(request: web.Request) -> web.StreamResponse:
        message = orjson.loads(await request.read())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(
            event(rpc_reply(message["id"], result=tool_result("ok", failed=False)))
        )
        await go_on.wait()  # the caller hangs up meanwhile
        for _ in range(20):
            await response.write(event(PROGRESS))
            await asyncio.sleep(0.01)
        return response

    async with recorder(script=lingering) as upstream:
        setup = await arrange(api, db, upstream.url)
        async with setup.stream(call("quick")) as response:
            first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 10)
            assert b'"ok"' in first
            response.close()
        go_on.set()
        [row] = await logged_calls(db, 1)
    assert outcomes([row]) == [("quick", "success", None)]
    assert gateway_warnings(caplog) == []  # an ordinary hang-up is nothing to warn about


@pytest.mark.parametrize("streamed", [True, False])
async def test_hanging_up_before_the_response_is_cancelled_by_the_caller(
    api: Api, db: asyncpg.Connection, streamed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    arrived, hung_up = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        message = orjson.loads(await request.read())
        arrived.set()
        answer = rpc_reply(message["id"], result=tool_result("late", failed=False))
        if not streamed:
            await hung_up.wait()
            return web.json_response(answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(event(PROGRESS))
        await hung_up.wait()
        await response.write(event(answer))
        return response

    async with recorder(script=slow) as upstream:
        setup = await arrange(api, db, upstream.url)
        posting = asyncio.create_task(
            api.post(setup.path, json=call("slow"), auth=setup.key, headers={"Accept": ACCEPT})
        )
        await asyncio.wait_for(arrived.wait(), 10)
        await asyncio.sleep(0.05)
        posting.cancel()  # the caller gives up: its connection closes
        with pytest.raises(asyncio.CancelledError):
            await posting
        await asyncio.sleep(0.05)
        hung_up.set()
        [row] = await logged_calls(db, 1)
    assert outcomes([row]) == [("slow", "error", CALLER_HUNG_UP)]
    assert gateway_warnings(caplog) == []


async def test_an_upstream_breaking_off_is_named_as_the_upstream(
    api: Api, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    async def breaking(request: web.Request) -> web.StreamResponse:
        message = orjson.loads(await request.read())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(event(PROGRESS))
        if message["params"]["name"] == "answered":
            await response.write(
                event(rpc_reply(message["id"], result=tool_result("done", failed=False)))
            )
        assert request.transport is not None
        request.transport.abort()
        return response

    async with recorder(script=breaking) as upstream:
        setup = await arrange(api, db, upstream.url)
        for name in ("cut", "answered"):
            async with setup.stream(call(name)) as response:
                with pytest.raises(aiohttp.ClientPayloadError):  # the stream is cut off
                    await response.read()
    rows = await logged_calls(db, 2)
    assert rows[0]["tool_name"] == "cut" and rows[0]["status"] == "error"
    assert rows[0]["error_message"].startswith("upstream broke off the response")
    # Its response had reached the caller: what came after does not change it.
    assert outcomes(rows[1:]) == [("answered", "success", None)]


# -- every call is seen ------------------------------------------------------------------------


ESCAPED_BODIES = [
    # (body, the tools it calls)
    (b'{"jsonrpc":"2.0","id":1,"method":"tools\\/call","params":{"name":"slash"}}', ["slash"]),
    (b'{"jsonrpc":"2.0","id":2,"method":"\\u0074ools/call","params":{"name":"u"}}', ["u"]),
    (
        b'{"jsonrpc":"2.0","id":3,"\\u006dethod":"\\u0074\\u006f\\u006f\\u006c\\u0073\\u002f'
        b'\\u0063\\u0061\\u006c\\u006c","params":{"name":"\\u0065scaped"}}',
        ["escaped"],
    ),
    (
        b'[{"jsonrpc":"2.0","id":4,"method":"tools\\/call","params":{"name":"b1"}},\n'
        b' {"jsonrpc":"2.0","id":5,"method":"tools/list"},\n'
        b' {"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"b2"}}]',
        ["b1", "b2"],
    ),
    (orjson.dumps(call("pretty", 7), option=orjson.OPT_INDENT_2), ["pretty"]),
    (
        b' \r\n\t{ "method" : "tools/call" , "id" : 8 , "params" : { "name" : "spaced" } } ',
        ["spaced"],
    ),
    (b'{"method":"tools/call","id":9,"params":{"name":"minimal"}}', ["minimal"]),
]


async def test_every_spelling_of_tools_call_is_logged(api: Api, db: asyncpg.Connection) -> None:
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        for body, _ in ESCAPED_BODIES:
            await api.post(
                setup.path,
                data=body,
                auth=setup.key,
                headers={"Content-Type": "application/json"},
                expect=200,
            )
    assert [body for _, _, body in upstream.requests] == [body for body, _ in ESCAPED_BODIES]
    expected = sorted(name for _, tools in ESCAPED_BODIES for name in tools)
    rows = await logged_calls(db, len(expected))
    assert sorted(r["tool_name"] for r in rows) == expected
    assert {r["status"] for r in rows} == {"success"}


# -- no caller can poison the log --------------------------------------------------------------


async def raw_post(port: int, path: str, key: str, caller_agent: bytes, body: bytes) -> bytes:
    """A POST with header bytes no HTTP client library would send."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST "
        + path.encode()
        + b" HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        b"Accept: " + ACCEPT.encode() + b"\r\nX-API-Key: " + key.encode() + b"\r\n"
        b"X-Caller-Agent: " + caller_agent + b"\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def test_one_tenants_bad_text_does_not_hold_back_another_tenants_calls(
    api: Api, db: asyncpg.Connection
) -> None:
    async with recorder() as upstream:
        good = await arrange(api, db, upstream.url)
        bad = await arrange(api, db, upstream.url)
        port = api.client.port
        assert port is not None
        path = f"/api/v1{bad.path}"
        hostile = [
            (
                b"agent-\xff\xfe-invalid-utf8",
                b'{"jsonrpc":"2.0","id":1,"method":"tools/call",'
                b'"params":{"name":"bad-\\u0000nul"}}',
            ),
            (b"\xc3\x28" * 3000, orjson.dumps(call("long-caller"))),  # over any index entry
            ("漢字".encode() * 1300, orjson.dumps(call("cjk-caller"))),
        ]

        async def good_load() -> int:
            sent = 0
            for batch in range(10):
                replies = await asyncio.gather(
                    *(
                        api.post(good.path, json=call(f"good-{batch}-{i}"), auth=good.key)
                        for i in range(30)
                    )
                )
                assert {r.status for r in replies} == {200}
                sent += len(replies)
            return sent

        loading = asyncio.create_task(good_load())
        for caller, body in hostile:
            answer = await raw_post(port, path, bad.key, caller, body)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        sent = await loading
        answered_at = time.monotonic()
        rows = await logged_calls(db, sent + len(hostile), within=1.0)
    assert time.monotonic() - answered_at < 1.0
    stored = {r["tool_name"]: r for r in rows}
    assert {name for name in stored if name.startswith("good-")} == {
        f"good-{b}-{i}" for b in range(10) for i in range(30)
    }
    assert stored["bad-nul"]["caller_agent"] == "agent-\ufffd\ufffd-invalid-utf8"
    assert len(stored["long-caller"]["caller_agent"]) == 255
    assert stored["cjk-caller"]["caller_agent"] == "漢字" * 127 + "漢"
    stats = api.app[CALL_LOG].stats
    assert (stats.rejected, stats.dropped, stats.failures) == (0, 0, 0)


# -- headers -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def bare_upstream() -> AsyncIterator[str]:
    """An upstream that sends no Content-Type at all (aiohttp's server would add one): 202 to
    a notification, 200 with a body to anything else. Yields its MCP URL."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        body = await reader.readexactly(length)
        if b'"id"' in body or head.startswith(b"DELETE"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nraw")
        else:
            writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/mcp"
    finally:
        server.close()
        await server.wait_closed()


async def test_no_header_the_upstream_did_not_send(api: Api, db: asyncpg.Connection) -> None:
    async with bare_upstream() as url:
        setup = await arrange(api, db, url)
        replies = [
            await api.post(
                setup.path, json=rpc("notifications/initialized", rid=None), auth=setup.key
            ),
            await api.delete(setup.path, auth=setup.key),
            await api.post(setup.path, json=call("raw"), auth=setup.key),
        ]
    # Only HTTP's own: the framing, the connection and the date.
    framing = {"content-length", "transfer-encoding", "connection", "keep-alive", "date"}
    for reply, status in zip(replies, (202, 200, 200), strict=True):
        assert reply.status == status
        assert {name.lower() for name in reply.headers} <= framing, reply.headers
