"""The tool playground: listing (cached, dropped in every process, fetched once at a time),
invoking with argument checks and a logged tool call, and who may do what."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.caching.caches import CACHES
from gateway.caching.shared import SHARED_CACHE
from gateway.mcp.client import McpClient
from gateway.upstreams.tool_lists import TOOL_LIST_MEMORY, TOOL_LISTS
from tests.helpers.alerting import add_server
from tests.helpers.api import Account, Api, AppFactory, Credential, Reply
from tests.helpers.hostile import (
    MiB,
    any_of_chain,
    catastrophic_pattern,
    distinct_objects,
    hostile_lister,
    ref_loop,
    schema_tool,
    unique_objects,
)
from tests.helpers.sdk_server import build_server
from tests.helpers.upstreams import (
    SDK_TOOL_NAMES,
    FakeUpstream,
    default_tools,
    fake_upstream,
    free_port,
    serve_loopback,
    unused_url,
)
from tests.helpers.waiting import until

PLAYGROUND = "mcp-gateway-playground"


# -- helpers ---------------------------------------------------------------------------------


async def listening(api: Api) -> None:
    """Wait for the NOTIFY listener: until then the in-memory backend caches nothing."""
    tool_lists = api.app[TOOL_LISTS]
    deadline = time.monotonic() + 5
    while not tool_lists.enabled:
        assert time.monotonic() < deadline, "the cache listener never connected"
        await asyncio.sleep(0.02)


class _Ear:
    """Registered on an app's Caches after its own caches: hears what they have just handled."""

    enabled = False

    def clear(self) -> None:
        pass


def hearing(api: Api, table: str) -> list[str]:
    """The keys of `table`'s invalidations, as `api`'s process handles them from now on."""
    heard: list[str] = []
    api.app[CACHES].register(_Ear(), {table: heard.append})
    return heard


async def setup(api: Api, url: str) -> tuple[Account, str]:
    """An org owner and a server of their workspace at `url`, with the listener up."""
    owner = await api.org(await api.signup())
    server_id = await add_server(api, owner, "upstream", url)
    await listening(api)
    return owner, server_id


async def tools(api: Api, server_id: str, auth: Credential, expect: int = 200) -> Reply:
    return await api.get(f"/servers/{server_id}/tools", auth=auth, expect=expect)


async def invoke(
    api: Api,
    server_id: str,
    auth: Credential,
    tool_name: str,
    arguments: Any = None,
    expect: int = 200,
) -> Reply:
    body: dict[str, Any] = {"tool_name": tool_name}
    if arguments is not None:
        body["arguments"] = arguments
    return await api.post(f"/servers/{server_id}/tools/invoke", json=body, auth=auth, expect=expect)


async def drop(api: Api, server_id: str, auth: Credential, expect: int = 204) -> Reply:
    return await api.delete(f"/servers/{server_id}/tools/cache", auth=auth, expect=expect)


async def logged(api: Api, auth: Credential, server_id: str) -> list[dict[str, Any]]:
    reply = await api.get("/tool-calls", params={"server_id": server_id}, auth=auth, expect=200)
    assert reply.body["total"] == len(reply.body["items"])
    items: list[dict[str, Any]] = reply.body["items"]
    return items


async def sdk_descriptors() -> dict[str, dict[str, Any]]:
    """The tools tests/sdk_server.py defines, as the SDK itself describes them."""
    described = {}
    for tool in await build_server(None).list_tools():
        dumped = tool.model_dump(by_alias=True, exclude_none=True, mode="json")
        described[tool.name] = {
            "name": dumped["name"],
            "description": dumped["description"],
            "inputSchema": dumped["inputSchema"],
        }
    return described


@contextlib.asynccontextmanager
async def gated_upstream() -> AsyncIterator[tuple[FakeUpstream, asyncio.Event, list[bytes]]]:
    """A FakeUpstream whose tools/list answers wait until the yielded event is set; the list
    holds every tools/list request as it arrives."""
    fake = FakeUpstream()
    gate = asyncio.Event()
    held: list[bytes] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()  # kept by aiohttp, so the fake reads it again
        if b'"tools/list"' in raw:
            held.append(raw)
            await gate.wait()
        return await fake.handle(request)

    app = web.Application()
    app.router.add_route("*", "/mcp", handle)
    async with serve_loopback(app) as base_url:
        fake.url = f"{base_url}/mcp"
        yield fake, gate, held
        gate.set()


# -- listing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("upstream", ["sdk_sse_url", "sdk_json_url"])
async def test_lists_the_tools_the_sdk_server_defines(
    api: Api, upstream: str, request: pytest.FixtureRequest
) -> None:
    owner, server_id = await setup(api, request.getfixturevalue(upstream))
    reply = await tools(api, server_id, owner)
    assert reply.body["server_id"] == server_id
    listed = {tool["name"]: tool for tool in reply.body["tools"]}
    # The SSE server pages by two, so this also follows nextCursor. Tools other tests
    # registered at run time in the shared server may come on top.
    assert set(listed) >= SDK_TOOL_NAMES
    for name, expected in (await sdk_descriptors()).items():
        # As the server describes it, and callable: the server disables none of its tools.
        assert listed[name] == {**expected, "disabled": False}


async def test_the_list_is_cached_until_the_cache_is_dropped(api: Api, sdk_json_url: str) -> None:
    owner, server_id = await setup(api, sdk_json_url)
    first = (await tools(api, server_id, owner)).body
    assert first["cached"] is False
    second = (await tools(api, server_id, owner)).body
    assert second["cached"] is True
    assert second["cached_at"] == first["cached_at"]
    assert second["tools"] == first["tools"]

    await drop(api, server_id, owner)
    third = (await tools(api, server_id, owner)).body
    assert third["cached"] is False
    assert third["cached_at"] != first["cached_at"]
    assert (await tools(api, server_id, owner)).body["cached"] is True


async def test_with_redis_processes_share_the_list_and_its_drop(
    make_api: AppFactory, sdk_json_url: str, redis_url: str
) -> None:
    a, b = await make_api(redis_url=redis_url), await make_api(redis_url=redis_url)
    owner, server_id = await setup(a, sdk_json_url)
    heard = hearing(a, "tool_list")
    try:
        fetched = (await tools(a, server_id, owner)).body
        assert fetched["cached"] is False
        shared = (await tools(b, server_id, owner)).body  # the other process: from Redis
        assert shared["cached"] is True
        assert shared["cached_at"] == fetched["cached_at"]

        await drop(b, server_id, owner)
        # No NOTIFY needed: the entry is gone from Redis for everyone at once.
        assert (await tools(a, server_id, owner)).body["cached"] is False
        # The NOTIFY comes a moment later (long moments under load). A fetch of A's still under
        # way then may have begun before the drop, so it is not stored: once A has heard it,
        # its next fetch is shared again.
        await until(lambda: len(heard) == 1)
        await tools(a, server_id, owner)
        assert (await tools(b, server_id, owner)).body["cached"] is True
    finally:
        await a.app[SHARED_CACHE].delete(f"tool_list_json:{server_id}")


async def test_a_drop_in_one_process_reaches_the_memory_of_another(
    make_api: AppFactory, sdk_json_url: str
) -> None:
    a, b = await make_api(), await make_api()  # two gateway processes, one database
    owner, server_id = await setup(a, sdk_json_url)
    await listening(b)
    await tools(a, server_id, owner)
    assert (await tools(a, server_id, owner)).body["cached"] is True

    await drop(b, server_id, owner)
    # A hears the NOTIFY a moment later; from then on it fetches again.
    deadline = time.monotonic() + 5
    while (await tools(a, server_id, owner)).body["cached"]:
        assert time.monotonic() < deadline, "process A kept serving the dropped list"
        await asyncio.sleep(0.02)
    assert (await tools(a, server_id, owner)).body["cached"] is True


async def test_a_drop_heard_mid_fetch_stops_it_storing_unless_this_process_dropped(
    make_api: AppFactory,
) -> None:
    """PostgreSQL hands a drop's NOTIFY to the listeners a moment after the drop, long moments
    under load, maybe while a fetch is under way. Elsewhere that fetch may have begun before the
    drop, so it is not stored; the process that dropped forgot at once, so a fetch it began
    since is as fresh as can be, and stored."""
    a, b = await make_api(), await make_api()
    async with gated_upstream() as (fake, gate, held):
        owner, server_id = await setup(a, fake.url)
        await listening(b)
        heard = hearing(a, "tool_list")

        await drop(a, server_id, owner)
        await until(lambda: len(heard) == 1)  # A hears its own drop back...
        pending = asyncio.create_task(tools(a, server_id, owner))
        await until(lambda: len(held) == 1)
        a.app[CACHES].invalidate(f"tool_list:{heard[0]}")  # ...as late as it may: mid-fetch
        gate.set()
        assert (await pending).body["cached"] is False
        assert (await tools(a, server_id, owner)).body["cached"] is True

        gate.clear()
        heard.clear()
        await drop(b, server_id, owner)
        await until(lambda: len(heard) == 1)
        pending = asyncio.create_task(tools(a, server_id, owner))
        await until(lambda: len(held) == 2)
        await drop(b, server_id, owner)
        await until(lambda: len(heard) == 2)  # A hears B's drop mid-fetch
        gate.set()
        assert (await pending).body["cached"] is False
        assert (await tools(a, server_id, owner)).body["cached"] is False  # not stored
        assert (await tools(a, server_id, owner)).body["cached"] is True


async def test_nothing_is_served_from_memory_while_invalidations_cannot_be_heard(
    api: Api, sdk_json_url: str
) -> None:
    owner, server_id = await setup(api, sdk_json_url)
    await tools(api, server_id, owner)
    assert (await tools(api, server_id, owner)).body["cached"] is True

    api.app[CACHES].set_listening(False)  # what the listener does when its connection drops
    assert (await tools(api, server_id, owner)).body["cached"] is False
    assert (await tools(api, server_id, owner)).body["cached"] is False
    api.app[CACHES].set_listening(True)  # reconnected: what was cached before is gone too
    assert (await tools(api, server_id, owner)).body["cached"] is False
    assert (await tools(api, server_id, owner)).body["cached"] is True


async def cached_again(api: Api, server_id: str, owner: Account) -> None:
    answers = [(await tools(api, server_id, owner)).body["cached"] for _ in range(3)]
    assert answers[-1] is True, answers


async def test_a_changed_server_is_never_answered_from_its_old_list(
    api: Api, sdk_json_url: str
) -> None:
    async with fake_upstream() as fake:
        owner, server_id = await setup(api, fake.url)
        await tools(api, server_id, owner)
        assert (await tools(api, server_id, owner)).body["cached"] is True

        path = f"/servers/{server_id}"
        await api.patch(path, json={"url": sdk_json_url}, auth=owner, expect=200)
        moved = (await tools(api, server_id, owner)).body
        assert moved["cached"] is False
        assert {tool["name"] for tool in moved["tools"]} >= SDK_TOOL_NAMES

        await api.patch(path, json={"url": fake.url}, auth=owner, expect=200)
        back = (await tools(api, server_id, owner)).body
        assert back["cached"] is False
        assert [tool["name"] for tool in back["tools"]] == [t["name"] for t in default_tools()]
        # Cached again. The PATCH's own NOTIFY may arrive after that fetch on a loaded machine
        # and drop it once (a refetch, never a stale answer): so at the latest on the next.
        await cached_again(api, server_id, owner)

        credentials = {"auth_type": "bearer", "auth_credentials": {"token": "new-token"}}
        await api.patch(path, json=credentials, auth=owner, expect=200)
        assert (await tools(api, server_id, owner)).body["cached"] is False
        assert fake.requests[-1].headers["Authorization"] == "Bearer new-token"

        await api.delete(path, auth=owner, expect=204)
        await tools(api, server_id, owner, expect=404)


async def test_concurrent_requests_on_a_cold_cache_share_one_fetch(api: Api) -> None:
    async with gated_upstream() as (fake, gate, held):
        owner, server_id = await setup(api, fake.url)
        pending = [asyncio.create_task(tools(api, server_id, owner)) for _ in range(10)]
        await until(lambda: len(held) > 0)
        await asyncio.sleep(0.3)  # let the other requests arrive while the fetch is held
        gate.set()
        replies = await asyncio.gather(*pending)
    assert len(held) == 1
    assert fake.rpc_methods().count("tools/list") == 1
    assert fake.rpc_methods().count("initialize") == 1
    assert len({reply.body["cached_at"] for reply in replies}) == 1


# -- listing failures ------------------------------------------------------------------------


async def test_an_unreachable_server_is_502(api: Api) -> None:
    owner, server_id = await setup(api, unused_url())
    reply = await tools(api, server_id, owner, expect=502)
    assert "connection refused" in reply.detail


async def test_a_server_answering_500_or_a_json_rpc_error_is_502(api: Api) -> None:
    async with fake_upstream(status=500) as fake:
        owner, server_id = await setup(api, fake.url)
        assert "HTTP 500" in (await tools(api, server_id, owner, expect=502)).detail
        fake.status = None
        fake.rpc_error = (-32603, "the tool registry is down")
        reply = await tools(api, server_id, owner, expect=502)
        assert "JSON-RPC error -32603: the tool registry is down" in reply.detail


async def test_a_server_that_does_not_answer_in_time_is_504(make_api: AppFactory) -> None:
    api = await make_api(proxy_timeout_seconds=0.3)
    async with fake_upstream(delay=2.0) as fake:
        owner, server_id = await setup(api, fake.url)
        reply = await tools(api, server_id, owner, expect=504)
        assert "timed out" in reply.detail


async def test_without_redis_the_list_is_still_served_uncached(make_api: AppFactory) -> None:
    api = await make_api(redis_url=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
    async with fake_upstream() as fake:
        owner, server_id = await setup(api, fake.url)
        assert (await tools(api, server_id, owner)).body["cached"] is False
        assert (await tools(api, server_id, owner)).body["cached"] is False
        # A drop cannot be promised, so it is refused rather than pretended.
        await drop(api, server_id, owner, expect=503)


# -- invoking --------------------------------------------------------------------------------


@pytest.mark.parametrize("upstream", ["sdk_sse_url", "sdk_json_url"])
async def test_invoke_calls_the_tool_and_logs_the_call(
    api: Api, upstream: str, request: pytest.FixtureRequest
) -> None:
    owner, server_id = await setup(api, request.getfixturevalue(upstream))
    reply = await invoke(api, server_id, owner, "add", {"a": 2, "b": 3})
    answer = reply.body
    assert answer["status"] == "success"
    assert answer["error_message"] is None
    assert answer["arguments_checked"] is True
    assert answer["arguments_unchecked_reason"] is None
    assert answer["result"]["content"] == [{"type": "text", "text": "5"}]
    assert answer["result"]["structuredContent"] == {"result": 5}
    assert answer["result"].get("isError") is False
    assert isinstance(answer["duration_ms"], int) and answer["duration_ms"] >= 0

    [row] = await logged(api, owner, server_id)  # committed before the answer
    assert row["id"] == answer["tool_call_id"]
    assert row["server_id"] == server_id
    assert row["server_name"] == "upstream"
    assert row["tool_name"] == "add"
    assert row["caller_agent"] == PLAYGROUND
    assert row["status"] == "success"
    assert row["error_message"] is None
    assert row["duration_ms"] == answer["duration_ms"]
    assert row["output_size_bytes"] == len(orjson.dumps(answer["result"]))
    assert row["input_tokens"] is None and row["output_tokens"] is None


async def test_a_tool_result_with_is_error_is_status_error(api: Api, sdk_json_url: str) -> None:
    owner, server_id = await setup(api, sdk_json_url)
    answer = (await invoke(api, server_id, owner, "fail")).body
    assert answer["status"] == "error"
    assert answer["result"]["isError"] is True
    assert answer["error_message"] == "Error executing tool fail"
    [row] = await logged(api, owner, server_id)
    assert row["id"] == answer["tool_call_id"]
    assert (row["status"], row["error_message"]) == ("error", "Error executing tool fail")
    assert row["caller_agent"] == PLAYGROUND


async def test_an_unreachable_server_is_a_logged_error_not_an_http_error(api: Api) -> None:
    owner, server_id = await setup(api, unused_url())
    answer = (await invoke(api, server_id, owner, "echo", {"text": "hi"})).body
    assert answer["status"] == "error"
    assert answer["result"] is None
    assert "connection refused" in answer["error_message"]
    assert answer["arguments_checked"] is False
    assert answer["arguments_unchecked_reason"] == "the server's tool list could not be read"
    [row] = await logged(api, owner, server_id)
    assert (row["id"], row["tool_name"]) == (answer["tool_call_id"], "echo")
    assert (row["status"], row["error_message"]) == ("error", answer["error_message"])
    assert row["output_size_bytes"] is None


async def test_a_call_answered_with_http_500_is_status_error(api: Api) -> None:
    async with fake_upstream() as fake:
        owner, server_id = await setup(api, fake.url)
        await tools(api, server_id, owner)  # listed while healthy: the call itself fails
        fake.status = 500
        answer = (await invoke(api, server_id, owner, "alpha", {"x": "1"})).body
    assert answer["status"] == "error"
    assert "HTTP 500" in answer["error_message"]
    [row] = await logged(api, owner, server_id)
    assert (row["tool_name"], row["status"]) == ("alpha", "error")
    assert row["error_message"] == answer["error_message"]


async def test_a_call_that_times_out_is_status_error(make_api: AppFactory) -> None:
    api = await make_api(proxy_timeout_seconds=0.3)
    async with fake_upstream() as fake:
        owner, server_id = await setup(api, fake.url)
        await tools(api, server_id, owner)
        fake.delay = 2.0
        answer = (await invoke(api, server_id, owner, "alpha")).body
    assert answer["status"] == "error"
    assert "timed out" in answer["error_message"]
    [row] = await logged(api, owner, server_id)
    assert row["status"] == "error" and "timed out" in row["error_message"]


async def test_a_json_rpc_error_while_listing_is_status_error(api: Api) -> None:
    async with fake_upstream(rpc_error=(-32603, "registry down")) as fake:
        owner, server_id = await setup(api, fake.url)
        answer = (await invoke(api, server_id, owner, "alpha")).body
    assert answer["status"] == "error"
    assert "JSON-RPC error -32603: registry down" in answer["error_message"]
    assert len(await logged(api, owner, server_id)) == 1


async def test_arguments_that_break_the_schema_are_422_and_not_called(
    api: Api, sdk_json_url: str
) -> None:
    owner, server_id = await setup(api, sdk_json_url)
    reply = await invoke(api, server_id, owner, "add", {"a": "two"}, expect=422)
    assert 'body.arguments.a: "two" is not of type "integer"' in reply.detail
    assert 'body.arguments: "b" is a required property' in reply.detail
    reply = await invoke(api, server_id, owner, "add", ["not", "an", "object"], expect=422)
    assert "body.arguments" in reply.detail
    assert await logged(api, owner, server_id) == []


async def test_an_unknown_tool_is_422_and_not_logged(api: Api, sdk_json_url: str) -> None:
    owner, server_id = await setup(api, sdk_json_url)
    reply = await invoke(api, server_id, owner, "no_such_tool", {}, expect=422)
    assert reply.detail.startswith("body.tool_name: the server has no tool named 'no_such_tool'")
    assert await logged(api, owner, server_id) == []


async def test_invoke_uses_the_tool_list_of_the_cache(api: Api) -> None:
    async with fake_upstream() as fake:
        owner, server_id = await setup(api, fake.url)
        await tools(api, server_id, owner)
        await invoke(api, server_id, owner, "alpha", {"x": "a"})
        await invoke(api, server_id, owner, "bravo", {"x": "b"})
    assert fake.rpc_methods().count("tools/list") == 1
    assert fake.rpc_methods().count("tools/call") == 2


# -- hostile upstreams -----------------------------------------------------------------------


class Bystander:
    """Another tenant going about its business: its own server list, and a tools/call
    through the proxy to its own (SDK) server, each timed."""

    def __init__(self, api: Api, account: Account, key: str, server_id: str) -> None:
        self.api = api
        self.account = account
        self.key = key
        self.url = str(api.client.make_url(f"/api/v1/proxy/{server_id}/mcp"))
        self.latencies: list[float] = []

    @classmethod
    async def arrive(cls, api: Api, sdk_url: str) -> Bystander:
        account = await api.signup()
        key = await api.api_key(account)
        server_id = await add_server(api, account, "bystander", sdk_url)
        return cls(api, account, key, server_id)

    async def busy_while(self, attack: asyncio.Task[Any]) -> None:
        """Requests one after another until the attack is over (one round at least)."""
        async with McpClient(self.api.client.session, self.url, {"X-API-Key": self.key}, 10) as mcp:
            while True:
                started = time.perf_counter()
                await self.api.get("/servers", auth=self.account, expect=200)
                self.latencies.append(time.perf_counter() - started)
                started = time.perf_counter()
                result = await mcp.call_tool("add", {"a": 2, "b": 3})
                self.latencies.append(time.perf_counter() - started)
                assert result["structuredContent"] == {"result": 5}
                if attack.done():
                    return
                await asyncio.sleep(0.02)


HOSTILE_SCHEMAS = {
    # name: (schema, arguments, HTTP status, arguments_checked)
    "pattern-28-chars-rejected": (catastrophic_pattern(), {"text": "a" * 28 + "!"}, 422, None),
    "pattern-28-chars-matched": (catastrophic_pattern(), {"text": "a" * 28}, 200, True),
    "any-of-chain": (any_of_chain(), {"value": "not a number"}, 200, False),
    "unique-3000-objects": (unique_objects(), {"items": distinct_objects(3000)}, 200, True),
    "ref-loop": (ref_loop(), {"value": {"x": 1}}, 200, True),
}


@pytest.mark.parametrize("attack", HOSTILE_SCHEMAS)
async def test_hostile_schemas_are_answered_while_other_tenants_stay_under_a_second(
    api: Api, sdk_json_url: str, attack: str
) -> None:
    schema, arguments, status, checked = HOSTILE_SCHEMAS[attack]
    async with fake_upstream(tools=[schema_tool("hostile", schema)]) as fake:
        owner, server_id = await setup(api, fake.url)
        await tools(api, server_id, owner)
        bystander = await Bystander.arrive(api, sdk_json_url)
        invoking = asyncio.create_task(
            invoke(api, server_id, owner, "hostile", arguments, expect=status)
        )
        await bystander.busy_while(invoking)
        reply = await invoking
    assert reply.status == status, reply.body
    assert max(bystander.latencies) < 1.0, bystander.latencies
    calls = fake.rpc_methods().count("tools/call")
    if status == 422:
        assert reply.detail == (f'body.arguments.text: "{"a" * 28}!" does not match "^(a+)+$"')
        assert calls == 0
        assert await logged(api, owner, server_id) == []
        return
    assert reply.body["status"] == "success"
    assert reply.body["arguments_checked"] is checked
    if checked:
        assert reply.body["arguments_unchecked_reason"] is None
    else:  # not enforced: the call went on, and the answer says why
        assert reply.body["arguments_unchecked_reason"] == "checking took longer than 1 s"
    assert calls == 1
    assert [row["tool_name"] for row in await logged(api, owner, server_id)] == ["hostile"]


async def test_a_schema_that_cannot_be_used_is_not_enforced_and_says_why(api: Api) -> None:
    remote = {"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/s.json"}}}
    tools_ = [schema_tool("remote", remote), schema_tool("broken", {"type": 12})]
    async with fake_upstream(tools=tools_) as fake:
        owner, server_id = await setup(api, fake.url)
        remote_answer = (await invoke(api, server_id, owner, "remote", {"a": 1})).body
        broken_answer = (await invoke(api, server_id, owner, "broken", {})).body
    assert remote_answer["status"] == "success"
    assert remote_answer["arguments_checked"] is False
    assert remote_answer["arguments_unchecked_reason"] == (
        "the inputSchema refers to another document ($ref), which the gateway does not fetch"
    )
    assert broken_answer["arguments_checked"] is False
    assert broken_answer["arguments_unchecked_reason"].startswith(
        "the inputSchema is not a valid JSON Schema: "
    )
    assert fake.rpc_methods().count("tools/call") == 2


GIGANTIC_LISTS = {
    "100-mb": ({"page_bytes": 100 * MiB}, "the tool list exceeds 8 MiB"),
    "100-mb-sse": ({"page_bytes": 100 * MiB, "sse": True}, "the tool list exceeds 8 MiB"),
    "many-pages": (
        {"page_bytes": 1 * MiB, "pages": 50, "tool_bytes": 8192},
        "the tool list exceeds 8 MiB",
    ),
    "2001-tools": ({"tool_count": 2001}, "the tool list has more than 2,000 tools"),
}


@pytest.mark.parametrize("attack", GIGANTIC_LISTS)
async def test_a_gigantic_tool_list_is_502_while_other_tenants_stay_under_a_second(
    api: Api, sdk_json_url: str, attack: str
) -> None:
    behaviour, reason = GIGANTIC_LISTS[attack]
    detail = f"cannot list the server's tools: {reason}"
    async with hostile_lister(**behaviour) as lister:
        owner, server_id = await setup(api, lister.url)
        bystander = await Bystander.arrive(api, sdk_json_url)
        listing = asyncio.create_task(tools(api, server_id, owner, expect=502))
        await bystander.busy_while(listing)
        assert (await listing).detail == detail
        assert max(bystander.latencies) < 1.0, bystander.latencies

        answer = (await invoke(api, server_id, owner, "tool_1", {})).body
        assert (answer["status"], answer["error_message"]) == ("error", detail)
        assert answer["arguments_checked"] is False

        check = (await api.post(f"/servers/{server_id}/probe", auth=owner, expect=200)).body
        assert (check["status"], check["error"]) == ("degraded", reason)
    assert api.app[TOOL_LIST_MEMORY].in_use == 0


async def test_a_large_list_within_the_bounds_is_served_and_its_memory_given_back(
    api: Api,
) -> None:
    """Over the free allowance, so it takes a permit while read, and while it is in use."""
    async with hostile_lister(page_bytes=3 * MiB, tool_bytes=8192) as lister:
        owner, server_id = await setup(api, lister.url)
        fetched = (await tools(api, server_id, owner)).body
        assert api.app[TOOL_LIST_MEMORY].in_use == 0
        cached = (await tools(api, server_id, owner)).body
        assert api.app[TOOL_LIST_MEMORY].in_use == 0
    assert (fetched["cached"], cached["cached"]) == (False, True)
    assert len(fetched["tools"]) == 384
    assert cached["tools"] == fetched["tools"]


# -- who may do what -------------------------------------------------------------------------


async def test_members_and_api_keys_may_list_but_only_admins_invoke_or_drop(
    api: Api, sdk_json_url: str
) -> None:
    owner, server_id = await setup(api, sdk_json_url)
    admin = await api.member(owner, "admin")
    member = await api.member(owner, "member")
    key = await api.api_key(owner)
    for reader in (member, key):
        await tools(api, server_id, reader)
        await invoke(api, server_id, reader, "echo", {"text": "hi"}, expect=403)
        await drop(api, server_id, reader, expect=403)
    assert await logged(api, owner, server_id) == []
    answer = (await invoke(api, server_id, admin, "echo", {"text": "hi"})).body
    assert answer["status"] == "success"
    await drop(api, server_id, admin)


async def test_another_workspace_cannot_see_or_use_the_server(api: Api, sdk_json_url: str) -> None:
    owner, server_id = await setup(api, sdk_json_url)
    await tools(api, server_id, owner)
    outsider = await api.org(await api.signup(), name="Elsewhere")
    outsider_key = await api.api_key(outsider)
    for caller in (outsider, outsider_key):
        assert (await tools(api, server_id, caller, expect=404)).detail == "server not found"
    await drop(api, server_id, outsider, expect=404)
    await invoke(api, server_id, outsider, "echo", {"text": "hi"}, expect=404)
    assert await logged(api, owner, server_id) == []
    assert (await tools(api, server_id, owner)).body["cached"] is True  # still cached
