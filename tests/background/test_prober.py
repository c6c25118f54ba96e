"""The background prober: rounds, bounded concurrency, turns between workspaces, several
processes, the loop itself."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from aiohttp import web

from gateway.background.prober import Prober
from gateway.db import servers as servers_db
from gateway.keys import POOL
from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.black_hole import black_hole
from tests.helpers.upstreams import FakeUpstream, fake_upstream, serve_loopback, unused_url


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


# -- turns between workspaces ----------------------------------------------------------------------


async def add_servers(db: asyncpg.Connection, owner: Account, url: str, count: int) -> None:
    """`count` servers of owner's workspace at `url`, all due (rows as POST /servers makes)."""
    await db.execute(
        "INSERT INTO servers (workspace_id, name, url) "
        "SELECT $1, 'dead-' || i, $2 FROM generate_series(1, $3) AS i",
        uuid.UUID(owner.workspace_id),
        url,
        count,
    )


async def test_claims_take_turns_between_workspaces(api: Api, db: asyncpg.Connection) -> None:
    """Every workspace's most overdue server first, however many another has waiting, and none
    of a workspace past its share counting what it has in flight."""
    crowd, single = await api.signup(), await api.signup()
    await add_servers(db, crowd, "http://127.0.0.1:9/mcp", 10)
    await db.execute("UPDATE servers SET next_probe_at = now() - interval '1 hour'")
    lone = await register(api, single, "http://127.0.0.1:9/mcp", "lone")
    pool = api.app[POOL]

    first = await servers_db.claim_due(pool, 2, 60.0, per_workspace=5)
    assert sorted(str(row.workspace_id) for row in first) == sorted(
        [crowd.workspace_id, single.workspace_id]
    )
    assert lone in {str(row.id) for row in first}
    # The crowd's share is 5; with four in flight (the one claimed above among them): one more.
    crowd_id = uuid.UUID(crowd.workspace_id)
    more = await servers_db.claim_due(pool, 50, 60.0, per_workspace=5, in_flight={crowd_id: 4})
    assert [row.workspace_id for row in more] == [crowd_id]
    # At its share, nothing of it; its servers stay due for later.
    assert (
        await servers_db.claim_due(pool, 50, 60.0, per_workspace=5, in_flight={crowd_id: 5}) == []
    )
    assert await db.fetchval("SELECT count(*) FROM servers WHERE next_probe_at <= now()") == 8


async def test_probes_in_flight_are_bounded_per_workspace(make_api: AppFactory) -> None:
    api = await make_api(probe_concurrency=50, probes_per_workspace=2)
    first, second = await api.signup(), await api.signup()
    async with (
        counting_upstream(delay=0.05) as (fake_a, peak_a),
        counting_upstream(delay=0.05) as (fake_b, peak_b),
    ):
        for i in range(6):
            await register(api, first, fake_a.url, f"a{i}")
            await register(api, second, fake_b.url, f"b{i}")
        assert await Prober.from_app(api.app).run_round() == 12
    assert (peak_a[0], peak_b[0]) == (2, 2)
    assert fake_a.rpc_methods().count("initialize") == 6


async def test_a_thousand_dead_servers_do_not_delay_another_workspaces_probes(
    make_api: AppFactory, db: asyncpg.Connection, sdk_json_url: str
) -> None:
    """Issue 20, finding 6: one workspace's 1,000 servers that never answer, the other's
    server is still probed every interval (plus a little slack), round after round, and the
    dead ones hold no more than their workspace's share of probes."""
    interval, timeout = 1.0, 3.0
    api = await make_api(
        run_workers=True, probe_interval_seconds=interval, probe_timeout_seconds=timeout
    )
    attacker, victim = await api.signup(), await api.signup()
    async with black_hole() as hole:
        await add_servers(db, attacker, hole.url(), 1000)
        server_id = await register(api, victim, sdk_json_url, "mine")
        await asyncio.sleep(7.0)
        checks = await db.fetch(
            "SELECT status, checked_at FROM health_checks WHERE server_id = $1 ORDER BY checked_at",
            uuid.UUID(server_id),
        )
        # Each probe of a dead server is held for the whole timeout, so those begun less than a
        # timeout apart were in flight together: never more than GATEWAY_PROBES_PER_WORKSPACE.
        assert hole.most_within(timeout - 0.2) == 5
    assert len(checks) >= 5, checks
    assert {c["status"] for c in checks} == {"healthy"}
    # One interval plus its jitter (10%) and the loop's look (a quarter interval), and a second.
    times = [c["checked_at"] for c in checks]
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(times)]
    assert max(gaps) < interval * 1.1 + interval / 4 + 1.0, gaps
