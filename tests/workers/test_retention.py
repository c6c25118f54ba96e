"""Pruning old health checks in batches, keeping the rollups and totals exact."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta

import asyncpg

from gateway.db import health_checks as health_checks_db
from gateway.keys import POOL
from gateway.mcp.probe import ProbeResult
from gateway.workers.retention import prune_old_checks
from tests.support import Api

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
