"""The background prober: rounds, bounded concurrency, several processes, the loop itself."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from aiohttp import web

from gateway.workers.prober import Prober
from tests.conftest import AppFactory
from tests.support import Account, Api
from tests.upstreams import FakeUpstream, fake_upstream, serve_loopback, unused_url


async def register(api: Api, admin: Account, url: str, name: str) -> str:
    reply = await api.post("/servers", json={"name": name, "url": url}, auth=admin, expect=201)
    server_id: str = reply.body["id"]
    return server_id


async def checks_per_server(db: asyncpg.Connection) -> dict[str, int]:
    rows = await db.fetch("SELECT server_id, count(*) AS n FROM health_checks GROUP BY server_id")
    return {str(r["server_id"]): r["n"] for r in rows}


async def test_a_round_probes_every_due_server_once(
    api: Api, db: asyncpg.Connection, sdk_json_url: str
) -> None:
    admin = await api.signup()
    async with fake_upstream() as fake:
        ids = {
            "healthy-sdk": await register(api, admin, sdk_json_url, "sdk"),
            "healthy-fake": await register(api, admin, fake.url, "fake"),
            "down": await register(api, admin, unused_url(), "gone"),
        }
        prober = Prober.from_app(api.app)
        assert await prober.run_round() == 3
        # Each is now scheduled an interval ahead: nothing is due.
        assert await prober.run_round() == 0
    assert await checks_per_server(db) == {server_id: 1 for server_id in ids.values()}
    servers = {s["id"]: s for s in (await api.get("/servers", auth=admin, expect=200)).body}
    assert servers[ids["healthy-sdk"]]["status"] == "healthy"
    assert servers[ids["healthy-fake"]]["status"] == "healthy"
    assert servers[ids["down"]]["status"] == "down"
    next_probes = await db.fetch("SELECT next_probe_at - now() AS wait FROM servers")
    for row in next_probes:
        # one interval (60 s) plus up to 10% jitter, less the time the round took
        assert 50 < row["wait"].total_seconds() <= 66


async def test_servers_are_due_again_after_the_interval(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_api(probe_interval_seconds=0.3)
    admin = await api.signup()
    await register(api, admin, unused_url(), "a")
    await register(api, admin, unused_url(), "b")
    prober = Prober.from_app(api.app)
    assert await prober.run_round() == 2
    assert await prober.run_round() == 0
    await asyncio.sleep(0.4)  # past the interval and its jitter (at most 10%)
    assert await prober.run_round() == 2
    assert sorted((await checks_per_server(db)).values()) == [2, 2]


@contextlib.asynccontextmanager
async def counting_upstream(**behaviour: Any) -> AsyncIterator[tuple[FakeUpstream, list[int]]]:
    """A fake upstream that also records the highest number of requests in flight at once."""
    fake = FakeUpstream(**behaviour)
    in_flight, peak = 0, [0]

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal in_flight
        in_flight += 1
        peak[0] = max(peak[0], in_flight)
        try:
            return await fake.handle(request)
        finally:
            in_flight -= 1

    app = web.Application()
    app.router.add_route("*", "/mcp", handle)
    async with serve_loopback(app) as base_url:
        fake.url = f"{base_url}/mcp"
        yield fake, peak


async def test_probes_in_flight_are_bounded(make_api: AppFactory) -> None:
    api = await make_api(probe_concurrency=3)
    admin = await api.signup()
    async with counting_upstream(delay=0.03) as (fake, peak):
        for i in range(8):
            await register(api, admin, fake.url, f"s{i}")
        assert await Prober.from_app(api.app).run_round() == 8
    assert peak[0] == 3
    assert fake.rpc_methods().count("initialize") == 8


async def test_two_gateways_on_one_database_probe_each_server_once(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    first = await make_api(probe_concurrency=4)
    second = await make_api(probe_concurrency=4)
    admin = await first.signup()
    async with fake_upstream(delay=0.02) as fake:
        ids = [await register(first, admin, fake.url, f"s{i}") for i in range(20)]
        rounds = [Prober.from_app(app.app).run_round() for app in (first, second)]
        counts = await asyncio.gather(*rounds)
        assert sum(counts) == 20
        assert all(counts), counts  # both took part
        assert [await Prober.from_app(app.app).run_round() for app in (first, second)] == [0, 0]
    assert await checks_per_server(db) == dict.fromkeys(ids, 1)
    assert fake.rpc_methods().count("initialize") == 20


async def _wait_for(api: Api, admin: Account, server_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        server: dict[str, Any] = (
            await api.get(f"/servers/{server_id}", auth=admin, expect=200)
        ).body
        if server["status"] == status or time.monotonic() > deadline:
            return server
        await asyncio.sleep(0.05)


async def test_background_prober_marks_up_and_down(make_api: AppFactory, sdk_json_url: str) -> None:
    """With workers on: a registered server turns healthy within one interval, and a stopped
    one turns down with a reason a person can read."""
    api = await make_api(run_workers=True, probe_interval_seconds=0.5)
    admin = await api.signup()
    sdk = await register(api, admin, sdk_json_url, "sdk")
    async with fake_upstream() as fake:
        doomed = await register(api, admin, fake.url, "doomed")
        assert (await _wait_for(api, admin, sdk, "healthy"))["status"] == "healthy"
        assert (await _wait_for(api, admin, doomed, "healthy"))["status"] == "healthy"
    stopped = await _wait_for(api, admin, doomed, "down")
    assert stopped["status"] == "down"
    checks = await api.get(
        "/health/checks", params={"server_id": doomed, "limit": 1}, auth=admin, expect=200
    )
    (latest,) = checks.body["items"]
    assert latest["status"] == "down"
    assert latest["error"].startswith("connection refused"), latest["error"]
