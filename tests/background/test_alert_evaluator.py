"""The alert evaluator: metrics over windows, the OK/FIRING state machine, turns between
workspaces, several processes."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from gateway.background.alert_evaluator import evaluate_due_rules, evaluate_rule, holds
from gateway.db import alert_evaluation as evaluation_db
from gateway.db.histograms import bucket_value, latency_bucket
from gateway.keys import POOL
from tests.helpers.alerting import add_rule, add_server, ago, claim_all, evaluate, events, ingest
from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.upstreams import fake_upstream

# 10 calls on one server in the last minutes: 2 errors, durations 10, 20, ..., 100 ms.
# error_rate 0.2, call_count 10, avg_latency_ms 55, p95 (nearest rank: the 10th) 100.
CALLS = [
    {"status": "error" if i < 2 else "success", "duration_ms": 10 * (i + 1)} for i in range(10)
]

# (metric, operator, threshold, fires on the server with CALLS)
CASES = [
    ("error_rate", ">", 0.1, True),
    ("error_rate", ">", 0.2, False),
    ("error_rate", ">=", 0.2, True),
    ("error_rate", "<", 0.25, True),
    ("error_rate", "<=", 0.19, False),
    ("error_rate", "==", 0.2, True),
    ("error_rate", "==", 0.3, False),
    ("call_count", "==", 10, True),
    ("call_count", "<", 10, False),
    ("call_count", ">=", 10, True),
    ("avg_latency_ms", ">", 50, True),
    ("avg_latency_ms", ">", 55, False),
    ("avg_latency_ms", ">=", 55, True),
    ("avg_latency_ms", "<=", 54.9, False),
    ("p95_latency_ms", ">=", 100, True),
    ("p95_latency_ms", "<", 100, False),
    ("p95_latency_ms", ">", 90, True),
    ("p95_latency_ms", "==", 100, True),
]


def test_holds() -> None:
    assert holds(0.30000000000000004, "==", 0.3)
    assert not holds(0.30000000000000004, ">", 0.3)
    assert holds(0.30000000000000004, "<=", 0.3)
    assert holds(2, ">", 1) and holds(1, "<", 2) and not holds(1, "<", 1)


async def test_each_metric_and_operator(api: Api) -> None:
    owner = await api.signup()
    busy = await add_server(api, owner, "busy")
    await ingest(api, owner, busy, [{**c, "created_at": ago(minutes=2)} for c in CALLS])
    # Outside every 5-minute window: must not count.
    await ingest(api, owner, busy, [{"status": "error", "created_at": ago(minutes=8)}] * 5)
    expected = {}
    for i, (metric, operator, threshold, fires) in enumerate(CASES):
        rule = await add_rule(
            api,
            owner,
            name=f"{i}: {metric} {operator} {threshold}",
            server_id=busy,
            metric=metric,
            operator=operator,
            threshold=threshold,
        )
        expected[rule["name"]] = fires
    await evaluate(api)
    fired = {e["rule_name"]: e["metric_value"] for e in await events(api, owner, limit=200)}
    assert set(fired) == {name for name, fires in expected.items() if fires}
    values = {name.split(": ")[1].split(" ")[0]: value for name, value in fired.items()}
    assert values == {
        "error_rate": 0.2,
        "call_count": 10,
        "avg_latency_ms": 55,
        "p95_latency_ms": 100,
    }


async def test_no_data_is_no_state_change(api: Api, db: asyncpg.Connection) -> None:
    owner = await api.signup()
    quiet = await add_server(api, owner, "quiet")
    for metric in ("error_rate", "avg_latency_ms", "p95_latency_ms", "server_down"):
        await add_rule(api, owner, name=metric, metric=metric, operator=">=", threshold=0)
    # call_count without calls is 0, a value: "no traffic" alerts work.
    await add_rule(api, owner, name="idle", metric="call_count", operator="<", threshold=1)
    # Calls without a duration give an error rate but no latency.
    await add_rule(api, owner, name="untimed", metric="error_rate", operator="<", threshold=1)
    await evaluate(api)
    assert [e["rule_name"] for e in await events(api, owner)] == ["idle"]

    await ingest(api, owner, quiet, [{"status": "success"}])
    await evaluate(api)
    names = {(e["rule_name"], e["event_type"]) for e in await events(api, owner)}
    assert names == {("idle", "FIRING"), ("idle", "RESOLVED"), ("error_rate", "FIRING")} | {
        ("untimed", "FIRING")
    }

    # The calls leave the window: error_rate has no data, so its incident stays open.
    await db.execute("DELETE FROM tool_calls; DELETE FROM tool_call_hourly")
    await evaluate(api)
    open_error_rate = await events(api, owner, rule_id=_rule_id(await events(api, owner)))
    assert [e["resolved_at"] for e in open_error_rate] == [None]


def _rule_id(items: list[dict[str, Any]]) -> str:
    rule_id: str = next(e["rule_id"] for e in items if e["rule_name"] == "error_rate")
    return rule_id


async def test_server_down_from_the_latest_probe(api: Api) -> None:
    owner = await api.signup()
    async with fake_upstream() as upstream:
        down = await add_server(api, owner, "down")  # nothing listens there
        up = await add_server(api, owner, "up", upstream.url)
        unprobed = await add_server(api, owner, "unprobed")
        for server in (down, up):
            await api.post(f"/servers/{server}/probe", auth=owner, expect=200)
        await add_rule(api, owner, name="down", metric="server_down", operator="==", threshold=1)
        await evaluate(api)
        fired = await events(api, owner)
        assert [(e["server_name"], e["metric_value"]) for e in fired] == [("down", 1.0)]
        assert unprobed not in {e["server_id"] for e in fired}

        # The latest probe decides: it answers now, so the incident resolves with value 0.
        await api.patch(f"/servers/{down}", json={"url": upstream.url}, auth=owner, expect=200)
        await api.post(f"/servers/{down}/probe", auth=owner, expect=200)
        await evaluate(api)
        latest = (await events(api, owner))[0]
        assert (latest["event_type"], latest["server_name"], latest["metric_value"]) == (
            "RESOLVED",
            "down",
            0.0,
        )


async def test_window_spanning_hours_uses_rollups_and_edges(api: Api) -> None:
    owner = await api.signup()
    server = await add_server(api, owner, "s")
    durations = [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 5000, 7000]
    offsets = [2, 30, 59, 61, 95, 119, 121, 150, 170, 175, 178, 179]  # minutes ago
    calls = [
        {
            "duration_ms": d,
            "status": "error" if m > 150 else "success",
            "created_at": ago(minutes=m),
        }
        for d, m in zip(durations, offsets, strict=True)
    ]
    # Too old for a 180-minute window.
    calls.append({"duration_ms": 9, "status": "error", "created_at": ago(minutes=190)})
    calls.append({"duration_ms": 9, "status": "error", "created_at": ago(hours=30)})
    await ingest(api, owner, server, calls)
    for metric in ("call_count", "error_rate", "avg_latency_ms", "p95_latency_ms"):
        await add_rule(
            api, owner, name=metric, metric=metric, operator=">", threshold=0, window_minutes=180
        )
    await evaluate(api)
    values = {e["rule_name"]: e["metric_value"] for e in await events(api, owner)}
    assert values["call_count"] == 12
    assert values["error_rate"] == pytest.approx(4 / 12)
    assert values["avg_latency_ms"] == pytest.approx(sum(durations) / 12)
    # The 95th percentile by nearest rank is the 12th of 12 (7000), read from histograms.
    assert values["p95_latency_ms"] == pytest.approx(bucket_value(latency_bucket(7000)))
    assert values["p95_latency_ms"] == pytest.approx(7000, rel=0.01)


async def test_firing_then_resolved(api: Api) -> None:
    owner = await api.signup()
    server = await add_server(api, owner, "billing")
    rule = await add_rule(
        api, owner, name="errors", metric="error_rate", operator=">", threshold=0.5
    )
    await ingest(api, owner, server, [{"status": "error"}])
    assert await evaluate(api) == 1
    [fired] = await events(api, owner)
    assert fired["event_type"] == "FIRING"
    assert fired["resolved_at"] is None
    assert fired["rule_id"] == rule["id"]
    assert fired["server_name"] == "billing"

    # Still holding: no second event.
    assert await evaluate(api) == 0
    assert len(await events(api, owner)) == 1

    await ingest(api, owner, server, [{"status": "success"}] * 3)
    assert await evaluate(api) == 1
    resolved, closed = await events(api, owner)
    assert closed["id"] == fired["id"]
    assert closed["resolved_at"] is not None
    assert resolved["event_type"] == "RESOLVED"
    assert resolved["fired_at"] == fired["fired_at"]
    assert resolved["resolved_at"] == closed["resolved_at"]
    assert resolved["metric_value"] == 0.25
    assert resolved["resolved_at"] > resolved["fired_at"]

    # And it can fire again: a new incident.
    await ingest(api, owner, server, [{"status": "error"}] * 5)
    assert await evaluate(api) == 1
    newest = (await events(api, owner))[0]
    assert newest["event_type"] == "FIRING"
    assert newest["resolved_at"] is None
    assert newest["id"] != fired["id"]


async def test_rule_for_all_servers_is_per_server(api: Api) -> None:
    owner = await api.signup()
    a = await add_server(api, owner, "a")
    b = await add_server(api, owner, "b")
    await ingest(api, owner, a, [{}])
    await add_rule(api, owner, metric="call_count", operator=">=", threshold=1)
    await evaluate(api)
    assert [e["server_name"] for e in await events(api, owner)] == ["a"]
    # A server registered later is covered too.
    c = await add_server(api, owner, "c")
    await ingest(api, owner, c, [{}])
    await ingest(api, owner, b, [{}])
    await evaluate(api)
    assert sorted(e["server_name"] for e in await events(api, owner)) == ["a", "b", "c"]
    assert sorted(e["server_name"] for e in await events(api, owner, event_type="FIRING")) == [
        "a",
        "b",
        "c",
    ]


async def test_disabled_rules_and_narrowed_rules(api: Api) -> None:
    owner = await api.signup()
    a = await add_server(api, owner, "a")
    b = await add_server(api, owner, "b")
    await ingest(api, owner, a, [{}])
    await ingest(api, owner, b, [{}])
    off = await add_rule(api, owner, name="off", metric="call_count", threshold=0, enabled=False)
    wide = await add_rule(api, owner, name="wide", metric="call_count", threshold=0)
    await evaluate(api)
    assert {(e["rule_name"], e["server_name"]) for e in await events(api, owner)} == {
        ("wide", "a"),
        ("wide", "b"),
    }
    # Narrowed to a: the incident on b ends (RESOLVED with b's current value), a's stays open.
    await api.patch(f"/alerts/rules/{wide['id']}", json={"server_id": a}, auth=owner, expect=200)
    await evaluate(api)
    latest = (await events(api, owner))[0]
    assert (latest["event_type"], latest["server_name"], latest["metric_value"]) == (
        "RESOLVED",
        "b",
        1.0,
    )
    assert await evaluate(api) == 0
    firing = await events(api, owner, event_type="FIRING")
    assert sorted(e["server_name"] for e in firing) == ["a", "b"]
    await api.patch(f"/alerts/rules/{off['id']}", json={"enabled": True}, auth=owner, expect=200)
    assert await evaluate(api) == 2


async def _firing_setup(api: Api) -> tuple[Account, str]:
    owner = await api.signup()
    server = await add_server(api, owner, "s")
    await ingest(api, owner, server, [{"status": "error"}])
    await add_rule(
        api,
        owner,
        metric="error_rate",
        threshold=0.5,
        webhook_url="http://127.0.0.1:9/hook",
        slack_webhook_url="http://127.0.0.1:9/slack",
    )
    return owner, server


async def test_two_evaluators_fire_once(make_api: AppFactory, db: asyncpg.Connection) -> None:
    first = await make_api()
    second = await make_api()
    owner, _ = await _firing_setup(first)
    pools = (first.app[POOL], second.app[POOL])

    # Claiming: the rule is taken by one of two concurrent rounds.
    made = await asyncio.gather(*(evaluate_due_rules(pool, 60.0) for pool in pools))
    assert sorted(made) == [0, 1]
    assert await evaluate_due_rules(pools[0], 60.0) == 0  # not due again within the interval

    # Even two processes evaluating the same rule at once (a late round overlapping the next)
    # open one incident: the partial unique index decides.
    await db.execute("DELETE FROM alert_events")
    for _ in range(5):
        [rule] = await claim_all(first)
        made = await asyncio.gather(*(evaluate_rule(pool, rule) for pool in pools))
        assert sum(made) in (0, 1)
    assert await db.fetchval("SELECT count(*) FROM alert_events") == 1
    # One event, so one notification per target.
    assert await db.fetchval("SELECT count(*) FROM alert_deliveries") == 2

    # Resolving concurrently adds one RESOLVED event.
    await db.execute("UPDATE alert_rules SET threshold = 2")
    [rule] = await claim_all(first)
    made = await asyncio.gather(*(evaluate_rule(pool, rule) for pool in pools))
    assert sorted(made) == [0, 1]
    types = await db.fetch("SELECT event_type FROM alert_events ORDER BY created_at")
    assert [r["event_type"] for r in types] == ["FIRING", "RESOLVED"]
    assert len(await events(second, owner)) == 2


async def test_restart_keeps_the_open_incident(make_api: AppFactory) -> None:
    before = await make_api()
    owner, server = await _firing_setup(before)
    await evaluate(before)
    [fired] = await events(before, owner)
    await before.client.close()  # the process stops

    after = await make_api()
    assert await evaluate(after) == 0
    assert await events(after, owner) == [fired]
    assert len(await events(after, owner, event_type="FIRING")) == 1

    await ingest(after, owner, server, [{"status": "success"}] * 3)
    assert await evaluate(after) == 1
    resolved, closed = await events(after, owner)
    assert closed["id"] == fired["id"]
    assert resolved["fired_at"] == fired["fired_at"]


async def test_loop_evaluates_on_its_interval(make_api: AppFactory) -> None:
    api = await make_api(run_workers=True, alert_eval_interval_seconds=0.2)
    owner, _ = await _firing_setup(api)
    for _ in range(50):
        if await events(api, owner):
            break
        await asyncio.sleep(0.1)
    [fired] = await events(api, owner)
    assert fired["event_type"] == "FIRING"
    await asyncio.sleep(0.5)  # more rounds: nothing new while the state holds
    assert len(await events(api, owner)) == 1


async def test_rules_are_claimed_in_turns_between_workspaces(
    api: Api, db: asyncpg.Connection
) -> None:
    """A workspace with many overdue rules does not push another's rule to the end of the
    round: every workspace's first rule comes first, then every workspace's second, ..."""
    crowd, single = await api.signup(), await api.signup()
    for i in range(6):
        await add_rule(api, crowd, name=f"crowd-{i}", metric="call_count")
    # Overdue by an hour, in the order they were made.
    await db.execute("UPDATE alert_rules SET next_eval_at = created_at - interval '1 hour'")
    lone = await add_rule(api, single, name="lone", metric="call_count")
    pool = api.app[POOL]
    first = await evaluation_db.claim_due_rules(pool, 60.0, 2)
    assert sorted(rule.name for rule in first) == ["crowd-0", "lone"]
    rest = await evaluation_db.claim_due_rules(pool, 60.0, 50)
    assert [rule.name for rule in rest] == [f"crowd-{i}" for i in range(1, 6)]
    assert lone["id"] in {str(rule.id) for rule in first}
