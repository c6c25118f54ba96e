"""What the proxy refuses to pass, and the bounds that keep one tenant from taking the others'
share: unreadable bodies and oversized batches are never forwarded (so never run unlogged),
upstream statuses that are not HTTP answers are not relayed, and neither open streams nor the
tool call log can be filled by one workspace."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import orjson
from aiohttp import web

from gateway.calllog.writer import CALL_LOG
from tests.helpers.api import Api
from tests.helpers.proxying import arrange, call, logged_calls, recorder, rpc
from tests.helpers.upstreams import fake_upstream

AppFactory = Callable[..., Awaitable[Api]]


async def until(condition: Callable[[], bool], within: float = 10.0) -> None:
    """Wait (boundedly) for something another task makes true."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "it did not happen in time"
        await asyncio.sleep(0.005)


# -- bodies the gateway cannot read as the server would ---------------------------------------


async def test_an_unreadable_body_is_a_parse_error_and_is_never_forwarded(
    api: Api, db: asyncpg.Connection
) -> None:
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        for body, problem in [
            # Invalid UTF-8 in the arguments: a lenient server runs it.
            (
                b'{"jsonrpc":"2.0","id":7,"method":"tools/call",'
                b'"params":{"name":"rm","arguments":{"path":"\xff"}}}',
                "not valid UTF-8",
            ),
            # Deeper than any parser goes, and deeper than 64 levels.
            (
                b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"rm",'
                b'"arguments":' + b"[" * 2000 + b"]" * 2000 + b"}}",
                "deeper than 64 levels",
            ),
            (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":' + b"{" * 3, "not JSON"),
            # In UTF-16 no `tools/call` shows in the bytes; Python's json.loads reads it.
            (
                '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"rm"}}'.encode(
                    "utf-16-le"
                ),
                "not valid UTF-8",
            ),
            (
                b'{"jsonrpc":"2.0","id":7,"method":"tools/call","method":"tools/list",'
                b'"params":{"name":"rm"}}',
                "'method' is named twice",
            ),
        ]:
            reply = await api.post(setup.path, data=body, auth=setup.key, expect=400)
            assert reply.body["jsonrpc"] == "2.0"
            assert reply.body["id"] is None
            assert reply.body["error"]["code"] == -32700
            assert problem in reply.body["error"]["message"]
        # The same server still answers what the gateway can read.
        await api.post(setup.path, json=call("ls"), auth=setup.key, expect=200)
    assert len(upstream.requests) == 1
    [row] = await logged_calls(db, 1)
    assert row["tool_name"] == "ls"


async def test_a_batch_of_more_than_100_messages_is_refused_whole(
    api: Api, db: asyncpg.Connection
) -> None:
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        # The attack: 4 MiB of calls would have been tens of thousands of log rows.
        flood = [call("x", rid=i) for i in range(30_000)]
        reply = await api.post(setup.path, json=flood, auth=setup.key, expect=400)
        assert reply.body["error"]["code"] == -32600
        assert "at most 100 messages" in reply.body["error"]["message"]
        reply = await api.post(setup.path, json=flood[:101], auth=setup.key, expect=400)
        assert len(upstream.requests) == 0
        # 100 is still a batch the gateway forwards, each call logged.
        reply = await api.post(setup.path, json=flood[:100], auth=setup.key, expect=200)
        assert len(reply.body) == 100
    await logged_calls(db, 100)


# -- upstream answers that are not HTTP answers ------------------------------------------------


@contextlib.asynccontextmanager
async def raw_upstream(head: bytes, then: bytes = b"") -> AsyncIterator[str]:
    """An upstream that answers every request with these bytes, exactly as given (statuses and
    reason phrases no HTTP library would send), then `then`, and keeps the connection open."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            request_head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in request_head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            writer.write(head + then)
            await writer.drain()
            await asyncio.sleep(30)  # a tunnel stays open
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.close()


async def test_switching_protocols_and_made_up_statuses_are_502_and_logged(
    api: Api, db: asyncpg.Connection
) -> None:
    answers = [
        # After a 101 the connection carries another protocol: relayed, it would be a raw
        # tunnel through the gateway (and any proxy in front of it).
        (
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: tunnel\r\nConnection: Upgrade\r\n\r\n",
            b"raw bytes of another protocol",
        ),
        (
            b"HTTP/1.1 999 Whatever\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n",
            b"{}",
        ),
    ]
    for head, then in answers:
        async with raw_upstream(head, then) as url:
            setup = await arrange(api, db, url)
            reply = await api.post(setup.path, json=call("x"), auth=setup.key, expect=502)
            status = head.split()[1].decode()
            assert reply.detail == f"upstream answered HTTP {status}, which is not relayed"
            assert "raw bytes" not in str(reply.body)
    rows = await logged_calls(db, 2)
    assert {row["status"] for row in rows} == {"error"}
    assert sorted(row["error_message"] for row in rows) == [
        "upstream answered HTTP 101, which is not relayed",
        "upstream answered HTTP 999, which is not relayed",
    ]


async def test_an_upstreams_reason_phrase_is_never_relayed(
    api: Api, db: asyncpg.Connection
) -> None:
    body = b'{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}'
    head = (
        b"HTTP/1.1 200 Fine\x01\x7fby me\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    async with raw_upstream(head, then=body) as url:
        setup = await arrange(api, db, url)
        async with api.client.post(
            f"/api/v1{setup.path}", json=call("x"), headers={"X-API-Key": setup.key}
        ) as response:
            assert response.status == 200
            assert response.reason == "OK"
            assert await response.read() == body
    [row] = await logged_calls(db, 1)
    assert (row["status"], row["error_message"]) == ("success", None)


# -- open streams ------------------------------------------------------------------------------


async def test_a_workspace_holds_at_most_its_bound_of_requests_in_flight(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_api(max_streams_per_workspace=3)

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": open\n\n")
        await asyncio.sleep(60)
        return response

    async with recorder(script=endless) as upstream:
        greedy = await arrange(api, db, upstream.url)
        other = await arrange(api, db, upstream.url)
        headers = {"X-API-Key": greedy.key, "Accept": "text/event-stream"}
        url = f"/api/v1{greedy.path}"
        async with contextlib.AsyncExitStack() as streams:
            opened = []
            for _ in range(3):
                response = await streams.enter_async_context(api.client.get(url, headers=headers))
                assert response.status == 200
                await response.content.readuntil(b"\n\n")
                opened.append(response)
            refused = await api.get(greedy.path, auth=greedy.key)
            assert refused.status == 429
            assert refused.headers["Retry-After"] == "1"
            assert "GATEWAY_MAX_STREAMS_PER_WORKSPACE" in refused.detail
            # Another workspace is not held up by it.
            async with api.client.get(
                f"/api/v1{other.path}",
                headers={"X-API-Key": other.key, "Accept": "text/event-stream"},
            ) as response:
                assert response.status == 200
            # A stream that ends gives its place back.
            opened[0].close()
            for _ in range(100):
                if len(upstream.requests) == 5:
                    await asyncio.sleep(0.05)
                async with api.client.get(url, headers=headers) as again:
                    if again.status == 200:
                        break
                await asyncio.sleep(0.05)
            assert again.status == 200


# -- the shared tool call log ------------------------------------------------------------------


async def test_one_workspace_cannot_fill_the_call_log_the_others_need(
    make_api: AppFactory, db: asyncpg.Connection, database_url: str
) -> None:
    api = await make_api(db_statement_timeout_seconds=30)
    call_log = api.app[CALL_LOG]
    call_log.workspace_rows = 3
    async with recorder() as upstream:
        flooder = await arrange(api, db, upstream.url)
        other = await arrange(api, db, upstream.url)
        # PostgreSQL holds the writer up (as a slow or restarting database would).
        blocker = await asyncpg.connect(database_url)
        transaction = blocker.transaction()
        await transaction.start()
        await blocker.execute("LOCK TABLE tool_calls IN ACCESS EXCLUSIVE MODE")
        try:
            for i in range(3):
                await api.post(
                    flooder.path, json=call("flood", rid=i), auth=flooder.key, expect=200
                )
            refused = await api.post(flooder.path, json=call("flood", rid=9), auth=flooder.key)
            assert refused.status == 503
            assert refused.headers["Retry-After"] == "1"
            assert "no room for this workspace's calls" in refused.detail
            batch = [call("flood", rid=i) for i in range(10, 12)]
            await api.post(flooder.path, json=batch, auth=flooder.key, expect=503)
            # Reads and other methods still go through, and so do other tenants' calls.
            await api.post(flooder.path, json=rpc("tools/list"), auth=flooder.key, expect=200)
            for i in range(3):
                await api.post(other.path, json=call("needed", rid=i), auth=other.key, expect=200)
            # Its ingestion is held to the same share.
            ingest = await api.post(
                "/tool-calls",
                json={"server_id": flooder.server_id, "tool_name": "imported", "status": "success"},
                auth=flooder.key,
            )
            assert ingest.status == 503
        finally:
            await transaction.rollback()
            await blocker.close()
        assert len([r for r in upstream.requests if b"flood" in r[2]]) == 3
        rows = await logged_calls(db, 6)
        assert sorted(row["tool_name"] for row in rows) == ["flood"] * 3 + ["needed"] * 3
        assert call_log.stats.dropped == 0
        # With the log written, the workspace has its room back.
        await api.post(flooder.path, json=call("again"), auth=flooder.key, expect=200)
    await logged_calls(db, 7)


async def test_nothing_refused_is_logged_twice_or_lost(api: Api, db: asyncpg.Connection) -> None:
    """A refused request changes nothing: no row, no upstream request, the same answer again."""
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        body = orjson.dumps([call("x", rid=i) for i in range(101)])
        first = await api.post(setup.path, data=body, auth=setup.key, expect=400)
        second = await api.post(setup.path, data=body, auth=setup.key, expect=400)
        assert first.body == second.body
    await asyncio.sleep(0.1)
    assert upstream.requests == []
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 0


# -- what a server would read differently -----------------------------------------------------


async def test_a_body_in_another_charset_is_refused_and_never_forwarded(
    api: Api, db: asyncpg.Connection
) -> None:
    """Express (the TypeScript SDK's servers) decodes by the charset: in UTF-7 a call reads
    `tools+AC8-call`, which no byte search for `tools/call` finds."""
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        utf7 = b'{"jsonrpc":"2.0","id":1,"method":"tools+AC8-call","params":{"name":"rm"}}'
        for content_type in ("application/json; charset=utf-7", "application/json;charset=latin1"):
            reply = await api.post(
                setup.path, data=utf7, auth=setup.key, headers={"Content-Type": content_type}
            )
            assert reply.status == 415
            assert reply.detail.startswith("the gateway reads MCP requests as UTF-8, not ")
        # Two Content-Types (a server may read either): aiohttp refuses the request itself.
        async with api.client.post(
            f"/api/v1{setup.path}",
            data=utf7,
            headers=[
                ("X-API-Key", setup.key),
                ("Content-Type", "application/json"),
                ("Content-Type", "application/json; charset=utf-7"),
            ],
        ) as response:
            assert response.status == 400
        assert upstream.requests == []
        for content_type in ('application/json; charset="UTF-8"', "application/json;charset=utf8"):
            await api.post(
                setup.path,
                json=call("ok"),
                auth=setup.key,
                headers={"Content-Type": content_type},
                expect=200,
            )
    await logged_calls(db, 2)


# -- calls in flight hold their room in the log -------------------------------------------------


async def test_calls_in_flight_count_against_the_workspaces_share(
    api: Api, db: asyncpg.Connection
) -> None:
    call_log = api.app[CALL_LOG]
    call_log.workspace_rows = 10
    release = asyncio.Event()

    async def held(request: web.Request) -> web.StreamResponse:
        message = orjson.loads(await request.read())
        await release.wait()
        answers = [
            {"jsonrpc": "2.0", "id": m["id"], "result": {"content": [], "isError": False}}
            for m in (message if isinstance(message, list) else [message])
        ]
        return web.json_response(answers if isinstance(message, list) else answers[0])

    async with recorder(script=held) as upstream:
        flooder = await arrange(api, db, upstream.url)
        other = await arrange(api, db, upstream.url)
        batch = [call("flood", rid=i) for i in range(10)]  # the whole share, in flight
        first = asyncio.create_task(api.post(flooder.path, json=batch, auth=flooder.key))
        await until(lambda: len(upstream.requests) == 1)
        # Its rows are not in the log yet, but their room is taken.
        refused = await api.post(flooder.path, json=batch, auth=flooder.key)
        assert refused.status == 503
        assert "no room for this workspace's calls" in refused.detail
        needed = asyncio.create_task(api.post(other.path, json=call("needed"), auth=other.key))
        await until(lambda: len(upstream.requests) == 2)
        release.set()
        assert (await first).status == 200
        assert (await needed).status == 200
        assert len(upstream.requests) == 2
    rows = await logged_calls(db, 11)
    assert sorted(row["tool_name"] for row in rows) == ["flood"] * 10 + ["needed"]
    assert call_log.stats.dropped == 0


async def test_the_playground_takes_room_in_the_log_before_it_calls(api: Api) -> None:
    async with fake_upstream() as upstream:
        owner = await api.signup()
        server = await api.post(
            "/servers", json={"name": "s", "url": upstream.url}, auth=owner, expect=201
        )
        path = f"/servers/{server.body['id']}/tools/invoke"
        await api.get(f"/servers/{server.body['id']}/tools", auth=owner, expect=200)
        call_log = api.app[CALL_LOG]
        call_log.max_rows = call_log.workspace_rows = 0  # as full as a long outage leaves it
        reply = await api.post(path, json={"tool_name": "echo"}, auth=owner)
        assert reply.status == 503
        assert "no room for this workspace's calls" in reply.detail
    assert "tools/call" not in upstream.rpc_methods()


async def test_playground_calls_count_as_requests_in_flight(make_api: AppFactory) -> None:
    api = await make_api(max_streams_per_workspace=3)
    async with fake_upstream() as upstream:
        owner = await api.signup()
        server = await api.post(
            "/servers", json={"name": "s", "url": upstream.url}, auth=owner, expect=201
        )
        server_id = server.body["id"]
        await api.get(f"/servers/{server_id}/tools", auth=owner, expect=200)  # now cached
        upstream.delay = 1.0
        listed = len(upstream.requests)
        invokes = [
            asyncio.create_task(
                api.post(
                    f"/servers/{server_id}/tools/invoke",
                    json={"tool_name": "echo"},
                    auth=owner,
                )
            )
            for _ in range(3)
        ]
        await until(lambda: len(upstream.requests) >= listed + 3)  # each invoke's first
        refused = await api.post(
            f"/servers/{server_id}/tools/invoke", json={"tool_name": "echo"}, auth=owner
        )
        assert refused.status == 429
        probe = await api.post(f"/servers/{server_id}/probe", auth=owner)
        assert probe.status == 429
        assert [(await invoke).status for invoke in invokes] == [200, 200, 200]
        upstream.delay = 0
        await api.post(f"/servers/{server_id}/probe", auth=owner, expect=200)


# -- large bodies take turns --------------------------------------------------------------------


_FLOOD = """
import asyncio, sys, aiohttp
async def main(url, key, count):
    body = (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":'
            b'{"a":[' + b"[]," * 99_000 + b"[]]}}}")
    headers = {"X-API-Key": key, "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async def one():
            async with http.post(url, data=body, headers=headers) as reply:
                await reply.read()
                return reply.status
        statuses = await asyncio.gather(*(one() for _ in range(count)))
    print(sorted(set(statuses)))
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def test_large_bodies_take_turns_while_other_tenants_stay_under_a_second(
    api: Api, db: asyncpg.Connection
) -> None:
    """Each body holds just under 100,000 small arrays: parsing one holds the event loop for
    tens of milliseconds. Sent all at once from another process, read one at a time, each
    followed by as long for everything else, they keep another tenant waiting for one body at
    most, not for all of them."""
    answer = b'{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}'

    async def cheap(request: web.Request) -> web.StreamResponse:
        return web.Response(body=answer, content_type="application/json")

    async with recorder(script=cheap) as upstream:
        heavy = await arrange(api, db, upstream.url)
        other = await arrange(api, db, upstream.url)
        flood = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _FLOOD, heavy.url, heavy.key, "48",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            await until(lambda: len(upstream.requests) >= 2, within=60)
            flood_started = time.perf_counter()
            waits = []
            for _ in range(10):
                started = time.perf_counter()
                await api.get("/servers", auth=other.key, expect=200)
                waits.append(time.perf_counter() - started)
            output, _ = await asyncio.wait_for(flood.communicate(), 120)
            flooded = time.perf_counter() - flood_started
            # The other tenant waits about one body's turn, a small part of the flood's time:
            # not the whole flood, as it would if the bodies did not take turns. (Measured
            # against the flood, not the clock: a loaded machine slows both alike.)
            assert max(waits) < flooded / 4, (waits, flooded)
        finally:
            if flood.returncode is None:
                flood.kill()
                await flood.wait()
        assert output.decode().strip() == "[200]"
