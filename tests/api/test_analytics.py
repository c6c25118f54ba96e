"""/analytics: figures checked against exact ones computed here from the ingested raw calls;
the window, validation, tenant isolation, the response cache (one snapshot that every endpoint
reads, so they agree with each other), the writer-kept latency
histograms (also after a server is deleted), the figures of the calls through a toolset, and
`rollups rebuild` of every rollup table."""

from __future__ import annotations

import asyncio
import random
import shutil
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from gateway.caching.shared import SHARED_CACHE
from gateway.db.histograms import latency_bucket
from gateway.db.rollups import floor_hour, rebuild
from gateway.keys import POOL
from tests.helpers.analytics import (
    ROLLUP_TABLES,
    analytics,
    check_against_raw,
    close,
    hour_of,
    iso,
    post_calls,
    random_calls,
    snapshot,
    workspace,
)
from tests.helpers.api import Api, AppFactory
from tests.helpers.processes import environment
from tests.helpers.toolset_calls import add_toolset, write_calls

ENDPOINTS = ("top-tools", "error-rates", "latency", "volume")


async def test_figures_equal_those_of_the_raw_calls(make_api: AppFactory) -> None:
    # Raw calls kept 40 days, so some can be ingested that are older than any window (and
    # whose days have no partition made at start, which assumes 30: the write makes them).
    api = await make_api(tool_call_retention_days=40)
    owner, key, servers = await workspace(api)
    rng = random.Random(5)
    now = datetime.now(UTC)
    # Most calls in the last day, some over the last month, some older than any window.
    calls = random_calls(rng, servers, now, 2000, hours=30)
    calls += random_calls(rng, servers, now, 300, hours=24 * 29)
    calls += random_calls(rng, servers[:1], now - timedelta(days=31), 50, hours=48)
    # A burst of errors and slow calls in one hour, and an hour of calls without durations.
    burst = now - timedelta(hours=5)
    calls += [
        {"server_id": servers[1], "tool_name": "fetch", "status": "error", "duration_ms": 5000 + i,
         "created_at": iso(burst)}
        for i in range(40)
    ]  # fmt: skip
    calls += [
        {"server_id": servers[2], "tool_name": "lookup", "status": "success",
         "created_at": iso(now - timedelta(days=3, minutes=i))}
        for i in range(5)
    ]  # fmt: skip
    await post_calls(api, key, calls)
    for days in (1, 7, 30):
        await check_against_raw(api, owner, calls, days, None)
    for server_id in servers:
        await check_against_raw(api, key, calls, 7, server_id)


async def test_defaults_and_validation(api: Api) -> None:
    _, key, servers = await workspace(api)
    assert await analytics(api, key, "top-tools", days=1) == []
    names = [f"tool-{i:03}" for i in range(120)]
    now = iso(datetime.now(UTC))
    calls = [
        {"server_id": servers[0], "tool_name": name, "status": "success", "created_at": now}
        for i, name in enumerate(names)
        for _ in range(1 + i % 3)
    ]
    await post_calls(api, key, calls)
    top = await analytics(api, key, "top-tools")
    assert len(top) == 10  # limit defaults to 10
    assert len(await analytics(api, key, "volume")) == 7 * 24  # days defaults to 7
    assert [t["call_count"] for t in top] == [3] * 10
    assert [t["tool_name"] for t in top] == [n for i, n in enumerate(names) if i % 3 == 2][:10]
    assert len(await analytics(api, key, "top-tools", limit=100)) == 100
    for endpoint in ENDPOINTS:
        for days in ("2", "0", "365", "seven", "7.5", ""):
            reply = await api.get(f"/analytics/{endpoint}", params={"days": days}, auth=key)
            assert reply.status == 422, (endpoint, days, reply.body)
            assert reply.detail.startswith("query.days"), reply.detail
        reply = await api.get(f"/analytics/{endpoint}", params={"server_id": "x"}, auth=key)
        assert reply.status == 422
        assert reply.detail.startswith("query.server_id"), reply.detail
    for limit in ("0", "101", "x"):
        reply = await api.get("/analytics/top-tools", params={"limit": limit}, auth=key)
        assert reply.status == 422
        assert reply.detail.startswith("query.limit"), reply.detail


async def test_other_workspaces_are_invisible(api: Api) -> None:
    owner, key, servers = await workspace(api)
    other, other_key, other_servers = await workspace(api)
    now = datetime.now(UTC)
    mine = [{"server_id": servers[0], "tool_name": "a", "status": "success", "duration_ms": 10,
             "created_at": iso(now)}]  # fmt: skip
    theirs = [{"server_id": other_servers[0], "tool_name": "b", "status": "error",
               "duration_ms": 99, "created_at": iso(now)}] * 3  # fmt: skip
    await post_calls(api, key, mine)
    await post_calls(api, other_key, theirs)
    assert await analytics(api, owner, "top-tools") == [
        {"tool_name": "a", "call_count": 1, "error_count": 0}
    ]
    assert (await analytics(api, owner, "volume", days=1))[-1]["call_count"] == 1
    # Same parameters, other workspace: its own answer, not the one just cached.
    assert await analytics(api, other, "top-tools") == [
        {"tool_name": "b", "call_count": 3, "error_count": 3}
    ]
    # A server of another workspace (or none at all) matches nothing, as in GET /tool-calls.
    for server_id in (other_servers[0], str(uuid.uuid4())):
        assert await analytics(api, owner, "top-tools", server_id=server_id) == []
        volume = await analytics(api, owner, "volume", days=1, server_id=server_id)
        assert len(volume) == 24
        assert all(item["call_count"] == 0 for item in volume)
        rates = await analytics(api, owner, "error-rates", days=1, server_id=server_id)
        assert all(item["error_rate"] == 0.0 and item["call_count"] == 0 for item in rates)
        latency = await analytics(api, owner, "latency", days=1, server_id=server_id)
        assert all(item["p50_ms"] is None for item in latency)


async def same_hour(fn: Any) -> Any:
    """Run `fn` (which compares answers across calls) again if the UTC hour changed meanwhile:
    the hour is part of the cache key."""
    for _ in range(2):
        hour = floor_hour(datetime.now(UTC))
        result = await fn()
        if floor_hour(datetime.now(UTC)) == hour:
            return result
    raise AssertionError("the hour changed twice")


async def test_answers_are_cached_per_workspace_window_and_server(api: Api) -> None:
    owner, key, servers = await workspace(api)
    now = datetime.now(UTC)

    def call(tool: str) -> dict[str, Any]:
        return {
            "server_id": servers[0],
            "tool_name": tool,
            "status": "success",
            "duration_ms": 20,
            "created_at": iso(now),
        }

    await post_calls(api, key, [call("a")])

    async def scenario() -> None:
        first = {e: await analytics(api, key, e, days=1) for e in ENDPOINTS}
        await post_calls(api, key, [call("b")] * 3)
        # Within the time to live: the same answers, for a token of the workspace as well.
        for endpoint in ENDPOINTS:
            assert await analytics(api, owner, endpoint, days=1) == first[endpoint]
        # Another limit reads the same snapshot: the same calls, however many tools are shown.
        assert await analytics(api, key, "top-tools", days=1, limit=5) == first["top-tools"]
        # Another window or server is another snapshot, read now.
        top = await analytics(api, key, "top-tools", days=7, limit=5)
        assert [t["tool_name"] for t in top] == ["b", "a"]
        volume = await analytics(api, key, "volume", days=1, server_id=servers[0])
        assert volume[-1]["call_count"] == 4

    await same_hour(scenario)


async def test_every_endpoint_counts_the_same_calls(make_api: AppFactory) -> None:
    """Cached or not, right after new calls land: the top tools, the hourly volume and the
    hourly error rates of a window add up to the same calls (one snapshot behind them all)."""
    api = await make_api(analytics_cache_seconds=60)
    _, key, servers = await workspace(api)
    now = datetime.now(UTC)
    batch = [
        {"server_id": servers[i % 2], "tool_name": f"t{i % 4}", "status": status,
         "duration_ms": 5 * i, "created_at": iso(now - timedelta(minutes=i))}
        for i, status in enumerate(["success", "error", "success"] * 4)
    ]  # fmt: skip

    async def agree(server_id: str | None) -> int:
        params: dict[str, Any] = {"days": 1, "limit": 100}
        if server_id is not None:
            params["server_id"] = server_id
        top = await analytics(api, key, "top-tools", **params)
        del params["limit"]
        volume = await analytics(api, key, "volume", **params)
        rates = await analytics(api, key, "error-rates", **params)
        total: int = sum(t["call_count"] for t in top)
        assert total == sum(v["call_count"] for v in volume) == sum(r["call_count"] for r in rates)
        errors = sum(t["error_count"] for t in top)
        assert errors == sum(round(r["error_rate"] * r["call_count"]) for r in rates)
        return total

    async def scenario() -> None:
        await post_calls(api, key, batch)
        assert await agree(None) == 12
        # New calls land: the cached snapshot still agrees with itself, for every endpoint.
        await post_calls(api, key, batch)
        assert await agree(None) == 12
        assert await agree(servers[0]) == 12  # a filter first asked for now: its half of all 24
        # Once the cached snapshot is gone (its time to live past), the window shows them.
        await api.app[SHARED_CACHE].clear()
        assert await agree(None) == 24

    await same_hour(scenario)


async def test_a_short_time_to_live_refreshes(make_api: Any) -> None:
    api = await make_api(analytics_cache_seconds=0.05)
    _, key, servers = await workspace(api)
    now = datetime.now(UTC)
    call = {"server_id": servers[0], "tool_name": "a", "status": "success", "duration_ms": 30,
            "created_at": iso(now)}  # fmt: skip
    await post_calls(api, key, [call])

    async def scenario() -> None:
        assert (await analytics(api, key, "volume", days=1))[-1]["call_count"] == 1
        await post_calls(api, key, [call, {**call, "duration_ms": 3000}])
        await asyncio.sleep(0.1)
        assert (await analytics(api, key, "volume", days=1))[-1]["call_count"] == 3
        latency = await analytics(api, key, "latency", days=1)
        assert latency[-1]["p99_ms"] is not None and close(latency[-1]["p99_ms"], 3000)

    await same_hour(scenario)


# (scope, hour) -> latency histogram
Histograms = dict[tuple[str, datetime], list[int]]


def histograms(calls: list[dict[str, Any]], scope_of: Any) -> Histograms:
    """The exact latency histogram of each (scope, hour) of `calls`, built here in Python."""
    result: Histograms = {}
    for call in calls:
        if call.get("duration_ms") is None:
            continue
        bucket = latency_bucket(call["duration_ms"])
        histogram = result.setdefault((scope_of(call), hour_of(call)), [])
        histogram.extend([0] * (bucket + 1 - len(histogram)))
        histogram[bucket] += 1
    return result


async def latency_rows(db: asyncpg.Connection, workspace_id: str) -> Histograms:
    rows = await db.fetch(
        "SELECT scope, hour, latency_histogram FROM latency_hourly WHERE workspace_id = $1",
        uuid.UUID(workspace_id),
    )
    return {(str(r["scope"]), r["hour"]): r["latency_histogram"] for r in rows}


async def check_latency_rows(
    db: asyncpg.Connection, workspace_id: str, calls: list[dict[str, Any]]
) -> None:
    """latency_hourly holds exactly the histograms of `calls`: per workspace, per server, and
    per toolset of the calls that came through one."""
    expected = histograms(calls, lambda c: workspace_id)
    expected |= histograms(calls, lambda c: c["server_id"])
    expected |= histograms([c for c in calls if c.get("toolset_id")], lambda c: c["toolset_id"])
    assert await latency_rows(db, workspace_id) == expected


async def test_latency_per_scope_is_kept_by_the_writer(
    make_api: Any, db: asyncpg.Connection
) -> None:
    """Each batch adds its durations to the hourly histograms of its workspace and servers;
    the latency series read them and match the exact percentiles of the raw calls."""
    api = await make_api(analytics_cache_seconds=0.001)
    owner, key, servers = await workspace(api)
    _, other_key, other_servers = await workspace(api)
    rng = random.Random(21)
    now = datetime.now(UTC)
    calls: list[dict[str, Any]] = []
    # Several requests over several hours and servers, so rows are upserted again and again.
    for _ in range(5):
        batch = random_calls(rng, servers, now, 400, hours=20)
        await post_calls(api, key, batch)
        calls += batch
    await post_calls(api, other_key, random_calls(rng, other_servers, now, 200, hours=20))
    await check_latency_rows(db, owner.workspace_id, calls)
    await asyncio.sleep(0.01)  # past the response cache
    await check_against_raw(api, owner, calls, 1, None)
    await check_against_raw(api, key, calls, 1, servers[1])


async def test_deleting_a_server_takes_its_calls_out_of_the_workspace_latency(
    make_api: Any, db: asyncpg.Connection
) -> None:
    api = await make_api(analytics_cache_seconds=0.001)
    owner, key, servers = await workspace(api)
    rng = random.Random(22)
    now = datetime.now(UTC)
    calls = random_calls(rng, servers, now, 1500, hours=12)
    # Hours in which only the doomed server has timed calls, and its slowest calls (the longest
    # histograms): the workspace's must lose those hours and shrink back.
    doomed = servers[0]
    alone = floor_hour(now) - timedelta(hours=15)
    calls += [
        {"server_id": doomed, "tool_name": "slow", "status": "success", "duration_ms": d,
         "created_at": iso(at)}
        for d, at in ((90_000, alone), (120_000, now), (250, alone + timedelta(hours=1)))
    ]  # fmt: skip
    calls += [
        {"server_id": servers[1], "tool_name": "untimed", "status": "success",
         "created_at": iso(alone + timedelta(hours=1))}
    ]  # fmt: skip
    await post_calls(api, key, calls)
    await check_latency_rows(db, owner.workspace_id, calls)

    await api.delete(f"/servers/{doomed}", auth=owner, expect=204)
    remaining = [c for c in calls if c["server_id"] != doomed]
    # Exactly as if the calls had never been made: the rows equal those of the other calls
    # (no hour left with an empty histogram, no trailing zero buckets)...
    await check_latency_rows(db, owner.workspace_id, remaining)
    assert not await db.fetchval(
        "SELECT count(*) FROM latency_hourly WHERE scope = $1", uuid.UUID(doomed)
    )
    # ...and to a rebuild from the raw calls that are left.
    before = await snapshot(db)
    async with api.app[POOL].acquire() as conn:
        await rebuild(conn)
    assert await snapshot(db) == before
    await asyncio.sleep(0.01)
    await check_against_raw(api, owner, remaining, 1, None)

    # Deleting the workspace takes the rest.
    await db.execute("DELETE FROM workspaces WHERE id = $1", uuid.UUID(owner.workspace_id))
    for table in ROLLUP_TABLES:
        assert not await db.fetchval(f"SELECT count(*) FROM {table}")


def row_count(tables: dict[str, list[dict[str, Any]]]) -> int:
    return sum(len(rows) for rows in tables.values())


async def test_rebuild_gives_what_the_writer_wrote(api: Api, db: asyncpg.Connection) -> None:
    _, key, servers = await workspace(api)
    _, other_key, other_servers = await workspace(api)
    rng = random.Random(9)
    now = datetime.now(UTC)
    # Several requests, so rollup rows are upserted more than once (histograms merged).
    for _ in range(4):
        await post_calls(api, key, random_calls(rng, servers, now, 700, hours=72))
    await post_calls(api, other_key, random_calls(rng, other_servers, now, 300, hours=10))
    # Edges of the histogram: 0 ms, the last exact bucket, the first growing one, huge values.
    edges = [0, 1, 49, 50, 51, 1000, 2**31 - 1]
    await post_calls(
        api,
        key,
        [
            {"server_id": servers[0], "tool_name": "edge", "status": "success", "duration_ms": d,
             "created_at": iso(now)}
            for d in edges
        ],
    )  # fmt: skip
    written = await snapshot(db)
    total = 4 * 700 + 300 + len(edges)
    assert sum(row["call_count"] for row in written["tool_call_hourly"]) == total
    assert all(written.values())
    async with api.app[POOL].acquire() as conn:
        done = await rebuild(conn)
    assert done.deleted == done.inserted == row_count(written)
    assert await snapshot(db) == written

    # Scoped to one workspace, after its rollups were lost: the other's stay as they were.
    workspace_id = await db.fetchval("SELECT workspace_id FROM servers WHERE id = $1", servers[0])
    for table in ROLLUP_TABLES:
        await db.execute(f"DELETE FROM {table} WHERE workspace_id = $1", workspace_id)
    async with api.app[POOL].acquire() as conn:
        done = await rebuild(conn, workspace_id)
    assert done.deleted == 0
    assert await snapshot(db) == written
    # Scoped to a workspace whose rollups are all there: replaced by the same rows.
    async with api.app[POOL].acquire() as conn:
        done = await rebuild(conn, workspace_id)
    assert 0 < done.deleted == done.inserted < row_count(written)
    assert await snapshot(db) == written


async def test_rebuild_command(api: Api, db: asyncpg.Connection, database_url: str) -> None:
    owner, key, servers = await workspace(api)
    await post_calls(api, key, random_calls(random.Random(3), servers, datetime.now(UTC), 500, 50))
    written = await snapshot(db)
    for table in ROLLUP_TABLES:
        await db.execute(f"DELETE FROM {table}")
    command = shutil.which("mcp-gateway")
    args = [command] if command else [sys.executable, "-m", "gateway"]
    result = await asyncio.to_thread(
        subprocess.run,
        [*args, "rollups", "rebuild", "--workspace", owner.workspace_id],
        env=environment(DATABASE_URL=database_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"workspace {owner.workspace_id}" in result.stdout
    assert await snapshot(db) == written
    # A workspace id that is not one is refused by the argument parser.
    bad = await asyncio.to_thread(
        subprocess.run,
        [*args, "rollups", "rebuild", "--workspace", "nope"],
        env=environment(DATABASE_URL=database_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--workspace" in bad.stderr


def through_toolsets(
    rng: random.Random, calls: list[dict[str, Any]], members: dict[str, list[str]]
) -> None:
    """Send some of `calls` through a toolset (by `toolset_id`) that has their server."""
    for call in calls:
        toolsets = [t for t, servers in members.items() if call["server_id"] in servers]
        call["toolset_id"] = rng.choice([None, *toolsets])


async def test_a_toolsets_figures_equal_those_of_the_calls_through_it(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    """Calls through two toolsets among direct ones (written by the call log as the toolset
    endpoint writes them): `toolset_id` narrows every endpoint to the calls through it, alone
    or with `server_id`, each its own cached snapshot; the workspace's figures still count
    every call."""
    api = await make_api(analytics_cache_seconds=60)
    owner, key, servers = await workspace(api)
    research = await add_toolset(db, owner.workspace_id, "research", servers)
    ops = await add_toolset(db, owner.workspace_id, "ops", servers[:2])
    rng = random.Random(23)
    now = datetime.now(UTC)
    calls = random_calls(rng, servers, now, 2500, hours=30)
    calls += random_calls(rng, servers, now, 300, hours=24 * 6)
    through_toolsets(rng, calls, {research: servers, ops: servers[:2]})
    await write_calls(api, owner.workspace_id, calls)
    await check_latency_rows(db, owner.workspace_id, calls)

    async def scenario() -> None:
        # Unfiltered first: a toolset's answers must not come from its cached snapshot.
        await check_against_raw(api, owner, calls, 1, None)
        for toolset in (research, ops):
            await check_against_raw(api, key, calls, 1, None, toolset)
            await check_against_raw(api, key, calls, 7, None, toolset)
        # One server's calls through one toolset: latency merged from the per-tool histograms.
        await check_against_raw(api, key, calls, 1, servers[1], research)
        await check_against_raw(api, key, calls, 7, servers[0], ops)
        # A server outside the toolset: no calls through it.
        await check_against_raw(api, key, calls, 1, servers[2], ops)

    await same_hour(scenario)

    # Another workspace's toolset, or none at all, matches no calls; a malformed id is 422.
    other, _, _ = await workspace(api)
    theirs = await add_toolset(db, other.workspace_id, "research")
    for toolset in (theirs, str(uuid.uuid4())):
        assert await analytics(api, key, "top-tools", toolset_id=toolset) == []
        volume = await analytics(api, key, "volume", days=1, toolset_id=toolset)
        assert len(volume) == 24 and all(item["call_count"] == 0 for item in volume)
        latency = await analytics(api, key, "latency", days=1, toolset_id=toolset)
        assert all(item["p50_ms"] is None for item in latency)
    for endpoint in ENDPOINTS:
        reply = await api.get(f"/analytics/{endpoint}", params={"toolset_id": "x"}, auth=key)
        assert reply.status == 422
        assert reply.detail.startswith("query.toolset_id"), reply.detail


async def test_deleting_a_server_takes_its_calls_out_of_its_toolsets_latency(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    """A toolset's latency rows lose the deleted server's durations (hours left without any go)
    and then equal those a rebuild computes from the calls that are left."""
    api = await make_api(analytics_cache_seconds=0.001)
    owner, _, servers = await workspace(api)
    research = await add_toolset(db, owner.workspace_id, "research", servers)
    ops = await add_toolset(db, owner.workspace_id, "ops", servers[:1])
    rng = random.Random(24)
    now = datetime.now(UTC)
    calls = random_calls(rng, servers, now, 1500, hours=12)
    through_toolsets(rng, calls, {research: servers, ops: servers[:1]})
    doomed = servers[0]
    # An hour in which only the doomed server has timed calls through the toolset, its slowest.
    alone = floor_hour(now) - timedelta(hours=15)
    calls += [
        {"server_id": doomed, "tool_name": "slow", "status": "success", "duration_ms": d,
         "created_at": iso(at), "toolset_id": research}
        for d, at in ((90_000, alone), (120_000, now))
    ]  # fmt: skip
    await write_calls(api, owner.workspace_id, calls)
    await check_latency_rows(db, owner.workspace_id, calls)
    assert await latency_rows(db, owner.workspace_id) != {}

    await api.delete(f"/servers/{doomed}", auth=owner, expect=204)
    remaining = [c for c in calls if c["server_id"] != doomed]
    await check_latency_rows(db, owner.workspace_id, remaining)
    # ops held only the doomed server's calls: nothing of it is left.
    assert not await db.fetchval(
        "SELECT count(*) FROM latency_hourly WHERE scope = $1", uuid.UUID(ops)
    )
    before = await snapshot(db)
    async with api.app[POOL].acquire() as conn:
        await rebuild(conn)
    assert await snapshot(db) == before
    await asyncio.sleep(0.01)
    await check_against_raw(api, owner, remaining, 1, None, research)
