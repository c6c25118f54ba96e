"""Analytics in tests: calls ingested at random, and the analytics endpoints checked against
the raw calls."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from gateway.db.rollups import floor_hour
from tests.helpers.alerting import add_server
from tests.helpers.api import Account, Api, Credential


async def post_calls(api: Api, auth: Credential, calls: list[dict[str, Any]]) -> None:
    for start in range(0, len(calls), 1000):
        await api.post("/tool-calls", json=calls[start : start + 1000], auth=auth, expect=201)


def random_calls(
    rng: random.Random, servers: list[str], now: datetime, count: int, hours: float
) -> list[dict[str, Any]]:
    """Calls spread over the last `hours`: several tools and statuses, latencies from 0 ms to
    a minute (lognormal), and some without a duration."""
    calls = []
    for _ in range(count):
        duration = None if rng.random() < 0.1 else int(rng.lognormvariate(math.log(80), 1.3))
        calls.append(
            {
                "server_id": rng.choice(servers),
                "tool_name": rng.choice(TOOLS),
                "status": "error" if rng.random() < 0.15 else "success",
                "caller_agent": rng.choice([None, "planner", "coder"]),
                "duration_ms": None if duration is None else min(duration, 60_000),
                "created_at": iso(now - timedelta(seconds=rng.uniform(0, hours * 3600))),
            }
        )
    return calls


async def check_against_raw(
    api: Api,
    auth: Credential,
    calls: list[dict[str, Any]],
    days: int,
    server_id: str | None,
    toolset_id: str | None = None,
) -> None:
    """Every endpoint's answer equals the figures of `calls` (those of the window, and of the
    server and the toolset when given)."""
    params: dict[str, Any] = {"days": days}
    if server_id is not None:
        params["server_id"] = server_id
        calls = [c for c in calls if c["server_id"] == server_id]
    if toolset_id is not None:
        params["toolset_id"] = toolset_id
        calls = [c for c in calls if c.get("toolset_id") == toolset_id]
    before = floor_hour(datetime.now(UTC))
    volume = await analytics(api, auth, "volume", **params)
    after = floor_hour(datetime.now(UTC))
    hours = [datetime.fromisoformat(item["hour"]) for item in volume]
    assert len(hours) == 24 * days
    assert hours == [hours[0] + timedelta(hours=i) for i in range(24 * days)]
    assert hours[-1] in (before, after)  # the current hour is the last
    in_window = [c for c in calls if hours[0] <= hour_of(c) <= hours[-1]]
    by_hour: dict[datetime, list[dict[str, Any]]] = defaultdict(list)
    for call in in_window:
        by_hour[hour_of(call)].append(call)

    assert volume == [{"hour": iso(h), "call_count": len(by_hour[h])} for h in hours]

    rates = await analytics(api, auth, "error-rates", **params)
    expected_rates = []
    for hour in hours:
        total = len(by_hour[hour])
        errors = sum(c["status"] == "error" for c in by_hour[hour])
        expected_rates.append(
            {"hour": iso(hour), "error_rate": errors / total if total else 0.0, "call_count": total}
        )
    assert rates == expected_rates

    latency = await analytics(api, auth, "latency", **params)
    assert [datetime.fromisoformat(item["hour"]) for item in latency] == hours
    for item, hour in zip(latency, hours, strict=True):
        durations = [c["duration_ms"] for c in by_hour[hour] if c.get("duration_ms") is not None]
        if not durations:
            assert item == {"hour": iso(hour), "p50_ms": None, "p95_ms": None, "p99_ms": None}
            continue
        for field, fraction in (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99)):
            exact = exact_percentile(durations, fraction)
            assert close(item[field], exact), (hour, field, item[field], exact)

    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for call in in_window:
        counts[call["tool_name"]][0] += 1
        counts[call["tool_name"]][1] += call["status"] == "error"
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1][0], kv[0]))
    expected_top = [{"tool_name": n, "call_count": c, "error_count": e} for n, (c, e) in ranked]
    assert await analytics(api, auth, "top-tools", limit=100, **params) == expected_top
    assert await analytics(api, auth, "top-tools", limit=2, **params) == expected_top[:2]


async def workspace(api: Api) -> tuple[Account, str, list[str]]:
    owner = await api.signup()
    key = await api.api_key(owner)
    servers = [await add_server(api, owner, f"server-{i}") for i in range(3)]
    return owner, key, servers


async def snapshot(db: asyncpg.Connection) -> dict[str, list[dict[str, Any]]]:
    """Every row of every rollup table."""
    return {
        table: [dict(row) for row in await db.fetch(f"SELECT * FROM {table} ORDER BY {order}")]
        for table, order in ROLLUP_TABLES.items()
    }


TOOLS = ("search", "fetch", "summarise", "translate", "lookup", "Fetch")


def iso(moment: datetime) -> str:
    return moment.isoformat()


def hour_of(call: dict[str, Any]) -> datetime:
    return floor_hour(datetime.fromisoformat(call["created_at"]))


def exact_percentile(values: list[int], fraction: float) -> float:
    """Nearest rank: the smallest value with at least `fraction` of all values at or below."""
    ordered = sorted(values)
    return float(ordered[max(1, math.ceil(fraction * len(ordered))) - 1])


def close(got: float | None, exact: float) -> bool:
    """Within 1% of the exact value (plus the rounding to 2 decimals)."""
    return got is not None and abs(got - exact) <= 0.01 * exact + 0.005


async def analytics(api: Api, auth: Credential, endpoint: str, **params: Any) -> Any:
    reply = await api.get(f"/analytics/{endpoint}", params=params, auth=auth, expect=200)
    return reply.body


ROLLUP_TABLES = {
    "tool_call_hourly": "workspace_id, server_id, tool_name, hour, toolset_id",
    "tool_call_caller_hourly": "workspace_id, caller_agent, server_id, tool_name, hour, toolset_id",
    "latency_hourly": "scope, hour",
}
