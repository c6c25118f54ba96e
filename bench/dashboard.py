"""Dashboard pages at scale: each page timed on the 10-million-call workspace of analytics.py.

    python bench/dashboard.py [--rows 10000000] [--requests 20] [--seed 1]

One command: the same private PostgreSQL (CPU 1), gateway (CPU 0, analytics cache of 1 ms,
so every analytics answer is computed again) and 10 million tool calls over 30 days as
bench/analytics.py, plus 30 days of probes every minute for each of the six servers and a
few alert rules with a year of events. Then logs in through the login form and times each
page (this process on CPU 1, one request at a time, 10 ms apart): the time until the whole
HTML has arrived, over `--requests` requests each. Target: every page under 100 ms.
Everything runs on 127.0.0.1; what it starts is stopped by PID, the database is deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.analytics import DAYS, load, rebuild_rollups, summary, vacuum
from bench.harness import BENCH_PASSWORD, OTHERS_CPU, Gateway, gateway, postgres

# Probes: one a minute per server for 30 days (about 260,000), health_hourly kept in step as
# the gateway's own writer keeps it, and each server's latest status and counters.
_PROBES = """
INSERT INTO health_checks (server_id, workspace_id, status, latency_ms, error, checked_at)
SELECT s.id, s.workspace_id,
       CASE WHEN random() < 0.01 THEN 'down' WHEN random() < 0.03 THEN 'degraded'
            ELSE 'healthy' END,
       20 + 200 * random(), NULL, now() - make_interval(mins => m)
FROM servers s, generate_series(0, $1 * 24 * 60 - 1) AS m
WHERE s.workspace_id = $2
"""
_HEALTH_HOURLY = """
INSERT INTO health_hourly (server_id, hour, healthy, degraded, down, latency_sum)
SELECT server_id, date_trunc('hour', checked_at),
       count(*) FILTER (WHERE status = 'healthy'), count(*) FILTER (WHERE status = 'degraded'),
       count(*) FILTER (WHERE status = 'down'), sum(latency_ms)
FROM health_checks GROUP BY 1, 2
"""
_SERVER_STATE = """
UPDATE servers s SET status = 'healthy', last_checked_at = now(), last_latency_ms = 42,
       checks_healthy = c.healthy, checks_degraded = c.degraded, checks_down = c.down
FROM (SELECT server_id, count(*) FILTER (WHERE status = 'healthy') AS healthy,
             count(*) FILTER (WHERE status = 'degraded') AS degraded,
             count(*) FILTER (WHERE status = 'down') AS down
      FROM health_checks GROUP BY server_id) AS c
WHERE c.server_id = s.id
"""
# Ten rules, each with an incident a day for a year (about 7,300 events: a FIRING event gets
# resolved_at when its incident ends), two still open.
_RULES = """
INSERT INTO alert_rules (workspace_id, name, server_id, metric, operator, threshold,
                         window_minutes)
SELECT $1, 'rule ' || n, (SELECT id FROM servers WHERE workspace_id = $1 ORDER BY id
                          OFFSET n % 6 LIMIT 1), 'error_rate', '>', 0.05, 15
FROM generate_series(1, 10) AS n
"""
_EVENTS = """
INSERT INTO alert_events (workspace_id, rule_id, server_id, event_type, metric_value, fired_at,
                          resolved_at, created_at)
SELECT r.workspace_id, r.id, r.server_id, kind, 0.08, now() - make_interval(days => d, hours => 2),
       now() - make_interval(days => d),
       CASE WHEN kind = 'RESOLVED' THEN now() - make_interval(days => d)
            ELSE now() - make_interval(days => d, hours => 2) END
FROM alert_rules r, generate_series(1, 365) AS d, unnest(ARRAY['FIRING', 'RESOLVED']) AS kind
WHERE r.workspace_id = $1
"""
_OPEN = """
INSERT INTO alert_events (workspace_id, rule_id, server_id, event_type, metric_value, fired_at)
SELECT workspace_id, id, server_id, 'FIRING', 0.09, now() - interval '20 minutes'
FROM alert_rules WHERE workspace_id = $1 ORDER BY name LIMIT 2
"""


async def arrange(gw: Gateway) -> tuple[uuid.UUID, uuid.UUID]:
    """Probes, rules and events; returns a server id and a tool call id to open pages of."""
    conn = await asyncpg.connect(gw.dsn)
    try:
        await conn.execute(_PROBES, DAYS, gw.workspace_id)
        await conn.execute(_HEALTH_HOURLY)
        await conn.execute(_SERVER_STATE)
        await conn.execute(_RULES, gw.workspace_id)
        await conn.execute(_EVENTS, gw.workspace_id)
        await conn.execute(_OPEN, gw.workspace_id)
        for table in ("health_checks", "health_hourly", "alert_events"):
            await conn.execute(f"VACUUM ANALYZE {table}")
        server_id = await conn.fetchval(
            "SELECT id FROM servers WHERE workspace_id = $1 ORDER BY name LIMIT 1",
            gw.workspace_id,
        )
        call_id = await conn.fetchval(
            "SELECT id FROM tool_calls WHERE server_id = $1 ORDER BY created_at DESC LIMIT 1",
            server_id,
        )
    finally:
        await conn.close()
    return server_id, call_id


async def log_in(http: aiohttp.ClientSession, gw: Gateway) -> None:
    async with http.get("/login") as response:
        token = re.search(r'name="csrf_token" value="([^"]+)"', await response.text())
    assert token is not None
    form = {"csrf_token": token.group(1), "email": gw.email, "password": BENCH_PASSWORD}
    async with http.post("/login", data=form) as response:
        assert response.status == 200 and str(response.url).endswith("/"), response.status


async def measure(
    gw: Gateway, server_id: uuid.UUID, call_id: uuid.UUID, requests: int
) -> dict[str, list[float]]:
    pages = [
        "/",
        "/servers",
        f"/servers/{server_id}",
        "/tool-calls",
        "/tool-calls?status=error",
        "/tool-calls?tool_name=search",
        f"/tool-calls?server_id={server_id}&caller_agent=coder",
        f"/tool-calls/{call_id}",
        "/analytics?days=1",
        "/analytics?days=7",
        "/analytics?days=30",
        f"/analytics?days=30&server_id={server_id}",
        "/alerts",
        "/settings",
    ]
    results: dict[str, list[float]] = {}
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(gw.url, cookie_jar=jar) as http:
        await log_in(http, gw)
        for page in pages:
            times = []
            for _ in range(requests):
                await asyncio.sleep(0.01)
                started = time.perf_counter()
                async with http.get(page, allow_redirects=False) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"GET {page}: {response.status}")
                times.append((time.perf_counter() - started) * 1000)
            label = page.replace(str(server_id), "<server>").replace(str(call_id), "<call>")
            results[label] = times
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--requests", type=int, default=20, help="per page")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    settings = {"GATEWAY_ANALYTICS_CACHE_SECONDS": "0.001", "GATEWAY_RUN_WORKERS": "false"}
    with postgres() as dsn, gateway(dsn, settings) as gw:
        print(f"loading {args.rows:,} tool calls over {DAYS} days")
        asyncio.run(load(gw, args.rows, args.seed))
        print(f"rollups rebuild: {rebuild_rollups(dsn):.0f} s")
        asyncio.run(vacuum(dsn))
        started = time.monotonic()
        server_id, call_id = asyncio.run(arrange(gw))
        print(f"probes, rules and events: {time.monotonic() - started:.0f} s")
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {int(OTHERS_CPU)})
        results = asyncio.run(measure(gw, server_id, call_id, args.requests))
    print(f"\n{'page (analytics uncached)':52} ({args.requests} each)")
    for page, times in results.items():
        print(f"{page:52} {summary(times)}")
    print("\ntarget: every page under 100 ms")


if __name__ == "__main__":
    main()
