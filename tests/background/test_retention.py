"""Retention: old health checks pruned in batches (rollups and totals kept exact); expired days
of tool calls dropped whole (analytics stay exact); old rollup hours and alert events pruned in
batches."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from gateway.background.retention import (
    prune_alert_events,
    prune_old_checks,
    prune_rollups,
    rollup_cutoff,
    run_once,
)
from gateway.calllog.records import ToolCall, new_call_id
from gateway.db import health_checks as health_checks_db
from gateway.db import tool_calls as tool_calls_db
from gateway.db.partitions import GRACE, day_name, floor_day, partitions
from gateway.db.rollups import TABLES, floor_hour, rebuild
from gateway.keys import POOL, SETTINGS
from gateway.mcp.probe import ProbeResult
from tests.helpers.analytics import check_against_raw, post_calls, random_calls
from tests.helpers.analytics import workspace as analytics_workspace
from tests.helpers.api import Api, AppFactory

_ROLLUP_VS_RAW = """
SELECT count(*) FROM (
    SELECT server_id, date_trunc('hour', checked_at, 'UTC') AS hour,
           count(*) FILTER (WHERE status = 'healthy') AS healthy,
           count(*) FILTER (WHERE status = 'degraded') AS degraded,
           count(*) FILTER (WHERE status = 'down') AS down,
           round(sum(latency_ms)::numeric, 6) AS latency_sum
    FROM health_checks GROUP BY 1, 2
) raw
FULL JOIN (
    SELECT server_id, hour, healthy::bigint, degraded::bigint, down::bigint,
           round(latency_sum::numeric, 6) AS latency_sum
    FROM health_hourly
) rollup USING (server_id, hour)
WHERE raw IS DISTINCT FROM rollup
"""


async def test_prunes_only_old_checks_in_batches(api: Api, db: asyncpg.Connection) -> None:
    admin = await api.signup()
    servers = []
    for name in ("a", "b"):
        reply = await api.post(
            "/servers", json={"name": name, "url": "http://x.test/mcp"}, auth=admin, expect=201
        )
        servers.append(uuid.UUID(reply.body["id"]))
    now: datetime = await db.fetchval("SELECT now()")
    ages_days = [200, 120, 100, 95, 91, 90.01, 89.9, 30, 1, 0]
    statuses = ["healthy", "down", "degraded"]
    for i, age in enumerate(ages_days):
        for server in servers:
            # Two checks in the same hour, so a rollup row is emptied only by the second.
            for offset in (0, 1):
                result = ProbeResult(statuses[(i + offset) % 3], 10.0 + i, None, None, None)
                when = now - timedelta(days=age, seconds=offset)
                await health_checks_db.record(db, server, result, checked_at=when)

    deleted = await prune_old_checks(api.app[POOL], 90, batch_size=5, pause=0)
    assert deleted == 6 * 2 * 2
    remaining = await db.fetchval("SELECT count(*) FROM health_checks")
    assert remaining == 4 * 2 * 2
    oldest = await db.fetchval("SELECT min(checked_at) FROM health_checks")
    assert oldest > now - timedelta(days=90)

    # The rollups and the counters still describe exactly the rows that are left.
    assert await db.fetchval(_ROLLUP_VS_RAW) == 0
    empty = "SELECT count(*) FROM health_hourly WHERE healthy + degraded + down = 0"
    assert await db.fetchval(empty) == 0
    checks = await api.get("/health/checks", params={"limit": 1}, auth=admin, expect=200)
    assert checks.body["total"] == remaining
    for status in statuses:
        reply = await api.get(
            "/health/checks", params={"status": status, "limit": 200}, auth=admin, expect=200
        )
        assert reply.body["total"] == len(reply.body["items"])
    summary = await api.get("/health/summary", params={"days": 365}, auth=admin, expect=200)
    assert [s["total_checks"] for s in summary.body] == [8, 8]

    assert await prune_old_checks(api.app[POOL], 90, batch_size=5, pause=0) == 0


async def test_one_process_prunes_at_a_time(api: Api, db: asyncpg.Connection) -> None:
    admin = await api.signup()
    reply = await api.post(
        "/servers", json={"name": "a", "url": "http://x.test/mcp"}, auth=admin, expect=201
    )
    server = uuid.UUID(reply.body["id"])
    now: datetime = await db.fetchval("SELECT now()")
    for minutes in range(40):
        result = ProbeResult("healthy", 1.0, None, None, None)
        when = now - timedelta(days=100, minutes=minutes)
        await health_checks_db.record(db, server, result, checked_at=when)
    pool = api.app[POOL]
    cutoff = now - timedelta(days=90)
    results = await asyncio.gather(*(health_checks_db.prune(pool, cutoff, 40) for _ in range(3)))
    assert sorted(results)[-1] == 40 and sum(results) == 40
    assert await db.fetchval(_ROLLUP_VS_RAW) == 0
    assert await db.fetchval("SELECT checks_healthy FROM servers") == 0


# -- tool calls, their rollups, alert events ---------------------------------------------------


async def test_expired_days_go_whole_and_analytics_stay_exact(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    """Retention drops the partitions of the days past GATEWAY_TOOL_CALL_RETENTION_DAYS (and
    an hour's grace), nothing else; the rollups stay, so analytics over 30 days give the
    figures of every call ever made, before a rebuild of the rollups and after it."""
    api = await make_api(tool_call_retention_days=40)
    owner, key, servers = await analytics_workspace(api)
    rng = random.Random(16)
    now = datetime.now(UTC)
    calls = random_calls(rng, servers, now, 400, hours=24 * 29)
    calls += random_calls(rng, servers, now, 100, hours=24)
    await post_calls(api, key, calls)
    settings = api.app[SETTINGS].replace(tool_call_retention_days=3, rollup_retention_days=1)
    pool = api.app[POOL]

    cutoff = now - timedelta(days=3) - GRACE
    async with pool.acquire() as conn:
        gone = {p.name for p in await partitions(conn) if p.end <= cutoff}
    # The day before the cutoff's goes, the cutoff's own stays (in the hour's grace after
    # midnight, that is four and five days ago).
    assert day_name(floor_day(cutoff) - timedelta(days=1)) in gone
    assert day_name(floor_day(cutoff)) not in gone

    done = await run_once(pool, settings, now=now, pause=0)
    assert set(done.dropped) == gone
    assert done.failed == [] and done.rollup_rows == 0
    left = await db.fetch("SELECT created_at FROM tool_calls")
    assert sorted(r["created_at"] for r in left) == sorted(
        t
        for t in (datetime.fromisoformat(c["created_at"]) for c in calls)
        if t >= floor_day(cutoff)
    )
    for days in (1, 7, 30):
        await check_against_raw(api, owner, calls, days, None)
    # A rebuild recomputes only the hours whose calls are all still stored.
    async with pool.acquire() as conn:
        await rebuild(conn)
    for days in (7, 30):
        await check_against_raw(api, owner, calls, days, None)
    await check_against_raw(api, key, calls, 7, servers[0])
    # Nothing more to drop.
    assert (await run_once(pool, settings, now=now, pause=0)).dropped == []


async def test_rollups_and_alert_events_go_in_batches(api: Api, db: asyncpg.Connection) -> None:
    admin = await api.signup()
    workspace_id = uuid.UUID(admin.workspace_id)
    server_id = uuid.UUID(
        (
            await api.post(
                "/servers", json={"name": "a", "url": "http://x.test/mcp"}, auth=admin, expect=201
            )
        ).body["id"]
    )
    now = datetime.now(UTC)
    # Calls 50, 45 and 40 days old (their days get partitions as they are written) and recent.
    ages = [timedelta(days=d, minutes=m) for d in (50, 45, 40, 2) for m in range(0, 300, 7)]
    calls = [
        ToolCall(
            id=new_call_id(),
            workspace_id=workspace_id,
            server_id=server_id,
            tool_name=f"tool-{i % 3}",
            caller_agent="a" if i % 2 else None,
            status="error" if i % 5 == 0 else "success",
            duration_ms=i,
            input_tokens=None,
            output_tokens=None,
            output_size_bytes=None,
            error_message=None,
            created_at=now - age,
        )
        for i, age in enumerate(ages)
    ]
    await tool_calls_db.write_batch(db, calls)
    settings = api.app[SETTINGS].replace(rollup_retention_days=42, alert_retention_days=10)
    cutoff = rollup_cutoff(settings, now)
    assert cutoff == floor_hour(now - timedelta(days=42))
    before = {t: await db.fetch(f"SELECT * FROM {t} ORDER BY 1, 2, 3, hour") for t in TABLES}

    rule_id = await db.fetchval(
        "INSERT INTO alert_rules (workspace_id, name, metric, operator, threshold, "
        "window_minutes) VALUES ($1, 'r', 'call_count', '>', 1, 5) RETURNING id",
        workspace_id,
    )

    async def event(age_days: float, kind: str, resolved: bool, delivery: str | None) -> uuid.UUID:
        at = now - timedelta(days=age_days)
        event_id: uuid.UUID = await db.fetchval(
            "INSERT INTO alert_events (workspace_id, rule_id, server_id, event_type, "
            "metric_value, fired_at, resolved_at, created_at) "
            "VALUES ($1, $2, $3, $4, 1, $5, $6, $5) RETURNING id",
            workspace_id, rule_id, server_id, kind, at, at if resolved else None,
        )  # fmt: skip
        if delivery is not None:
            delivery_id = await db.fetchval(
                "INSERT INTO alert_deliveries (event_id, workspace_id, rule_id, server_id, "
                "target, url, payload, status) "
                "VALUES ($1, $2, $3, $4, 'webhook', 'http://x.test', '{}', $5) RETURNING id",
                event_id, workspace_id, rule_id, server_id, delivery,
            )  # fmt: skip
            await db.execute(
                "INSERT INTO alert_delivery_attempts (delivery_id, attempt, attempted_at, "
                "duration_ms, status_code) VALUES ($1, 1, $2, 5, 200)",
                delivery_id, at,
            )  # fmt: skip
        return event_id

    old = [await event(20 + i, "FIRING", True, "delivered") for i in range(5)]
    old += [await event(20 + i, "RESOLVED", True, "failed") for i in range(4)]
    old += [await event(11, "RESOLVED", True, None)]
    kept = [
        await event(30, "FIRING", False, "delivered"),  # an incident still open
        await event(25, "RESOLVED", True, "pending"),  # its notification still being tried
        await event(9, "RESOLVED", True, "delivered"),  # within the retention
    ]
    pool = api.app[POOL]

    pruned = await prune_rollups(pool, settings, now, batch_size=4, pause=0)
    assert pruned == sum(1 for rows in before.values() for r in rows if r["hour"] < cutoff)
    for table in TABLES:
        after = await db.fetch(f"SELECT * FROM {table} ORDER BY 1, 2, 3, hour")
        assert after == [r for r in before[table] if r["hour"] >= cutoff], table
    assert await prune_alert_events(pool, settings, now, batch_size=3, pause=0) == len(old)
    assert sorted(r["id"] for r in await db.fetch("SELECT id FROM alert_events")) == sorted(kept)
    assert await db.fetchval("SELECT count(*) FROM alert_deliveries") == 3
    assert await db.fetchval("SELECT count(*) FROM alert_delivery_attempts") == 3
    # Rollups are never pruned inside the analytics' 30 days or the raw calls' retention.
    short = settings.replace(rollup_retention_days=1, tool_call_retention_days=35)
    assert rollup_cutoff(short, now) == floor_hour(now - timedelta(days=35))


async def test_tool_changes_go_after_the_alert_retention(api: Api, db: asyncpg.Connection) -> None:
    admin = await api.signup()
    workspace_id = uuid.UUID(admin.workspace_id)
    server_id = await db.fetchval(
        "INSERT INTO servers (workspace_id, name, url) VALUES ($1, 's', 'http://x.test/mcp') "
        "RETURNING id",
        workspace_id,
    )
    now = datetime.now(UTC)
    ages = [400, 401, 450, 399, 1]  # days
    for age in ages:
        await db.execute(
            "INSERT INTO tool_changes (server_id, workspace_id, tool_name, change, detected_at) "
            "VALUES ($1, $2, 't', 'added', $3)",
            server_id,
            workspace_id,
            now - timedelta(days=age, minutes=1),
        )
    settings = api.app[SETTINGS].replace(alert_retention_days=400)
    done = await run_once(api.app[POOL], settings, now=now, batch_size=1, pause=0)
    assert done.tool_changes == 3 and "tool changes" not in done.failed
    assert await db.fetchval("SELECT count(*) FROM tool_changes") == 2
