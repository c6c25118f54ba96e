"""A tools/call through a toolset against the same call through the per-server proxy.

    python bench/toolset.py [--seconds 5] [--runs 3]

One command: a private PostgreSQL, the cheap MCP upstream of bench/proxy.py (stateless, 2025
era), the gateway, three servers on that upstream and a toolset of them. wrk posts tools/call
to the per-server proxy ("proxy"), to the toolset within a 2025-era session ("toolset", the
Mcp-Session-Id of one initialize) and to the toolset as a 2026-07-28 client ("toolset-2026",
no session), in turn, at c=1 and c=64. Reported, as medians of ratios of runs made side by side:

- the cost of a toolset call against a proxied one: proxy req/s / toolset req/s at c=64, and
  the gateway's CPU time per request (/proc/<pid>/stat) over those runs. Target: at most 1.25;
- the p50 a toolset adds at c=1;
- the first request of a new 2025-era session (initialize, which opens a session with each of
  the three members): its median latency over 50 sessions, against a proxied call's p50.

Then checks that every call answered was logged. The gateway runs on CPU 0; upstream, wrk and
PostgreSQL on CPU 1; all on 127.0.0.1, stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    Gateway,
    WrkResult,
    gateway,
    mcp_upstream,
    postgres,
    wrk,
)
from bench.proxy_cost import cpu_seconds

_MEMBERS = 3
_SESSIONS = 50
_MODERN = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call"}


async def make_toolset(gw: Gateway, upstream_url: str) -> tuple[str, str]:
    """Three servers on the upstream and a toolset of them; (toolset id, server id of the
    first, whose `echo` the toolset exposes as `member_0__echo`)."""
    server_ids = [await gw.add_server(upstream_url) for _ in range(_MEMBERS)]
    conn = await asyncpg.connect(gw.dsn)
    try:
        toolset_id = await conn.fetchval(
            "INSERT INTO toolsets (workspace_id, name) VALUES ($1, 'bench') RETURNING id",
            gw.workspace_id,
        )
        for position, server_id in enumerate(server_ids):
            await conn.execute("UPDATE servers SET name = $2 WHERE id = $1", server_id,
                               f"member {position}")  # fmt: skip
            await conn.execute(
                "INSERT INTO toolset_servers (toolset_id, server_id, position) VALUES ($1, $2, $3)",
                toolset_id,
                server_id,
                position,
            )
    finally:
        await conn.close()
    return str(toolset_id), str(server_ids[0])


async def initialize(url: str, key: str) -> tuple[str, float]:
    """A new 2025-era session: its id, and how long the initialize took (seconds)."""
    import aiohttp

    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        },
    }
    headers = {"X-API-Key": key, "Accept": "application/json, text/event-stream"}
    async with aiohttp.ClientSession() as http:
        started = time.perf_counter()
        async with http.post(url, json=body, headers=headers) as response:
            await response.read()
            took = time.perf_counter() - started
            assert response.status == 200, response.status
            session = response.headers["Mcp-Session-Id"]
        notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with http.post(
            url, json=notification, headers={**headers, "Mcp-Session-Id": session}
        ) as response:
            assert response.status == 202, response.status
    return session, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=5, help="per wrk run")
    parser.add_argument("--runs", type=int, default=3, help="runs per target and concurrency")
    args = parser.parse_args()
    with postgres() as dsn, mcp_upstream() as upstream_url, gateway(dsn) as gw:
        toolset_id, server_id = asyncio.run(make_toolset(gw, upstream_url))
        toolset_url = f"{gw.url}/api/v1/toolsets/{toolset_id}/mcp"
        session, _ = asyncio.run(initialize(toolset_url, gw.key))
        tool = "member_0__echo"
        targets: dict[str, tuple[str, str, dict[str, str]]] = {
            "proxy": (f"{gw.url}/api/v1/proxy/{server_id}/mcp", "echo", {}),
            "toolset": (toolset_url, tool, {"Mcp-Session-Id": session}),
            "toolset-2026": (toolset_url, tool, {**_MODERN, "Mcp-Name": tool}),
        }
        for url, name, headers in targets.values():
            wrk(url, 16, 2, gw.key, tool=name, headers=headers)
        logged_before = asyncio.run(gw.count_calls())
        answered = 0
        runs: dict[int, dict[str, list[tuple[WrkResult, float]]]] = {}
        for c in (1, 64):
            runs[c] = {name: [] for name in targets}
            for _ in range(args.runs):
                for name, (url, tool_name, headers) in targets.items():
                    before = cpu_seconds(gw.pid)
                    result = wrk(url, c, args.seconds, gw.key, tool=tool_name, headers=headers)
                    time.sleep(0.3)  # the last calls' share of the call log
                    cpu = (cpu_seconds(gw.pid) - before) / max(result.requests, 1) * 1e6
                    runs[c][name].append((result, cpu))
                    answered += result.requests
                    print(f"{name:13} c={c:<3} {result} {cpu:.0f} µs CPU/request", file=sys.stderr)
        initializes = [asyncio.run(initialize(toolset_url, gw.key))[1] for _ in range(_SESSIONS)]
        deadline = time.monotonic() + 30
        logged = 0
        while time.monotonic() < deadline:
            logged = asyncio.run(gw.count_calls()) - logged_before
            if logged >= answered:
                break
            time.sleep(0.5)
    report(runs, initializes)
    print(f"\nrequests answered: {answered}, tool calls logged: {logged}")
    ok = logged >= answered
    print("log check:", "OK, nothing dropped" if ok else "MISMATCH")
    if not ok:
        raise SystemExit(1)


def report(
    runs: dict[int, dict[str, list[tuple[WrkResult, float]]]], initializes: list[float]
) -> None:
    print(f"\n{'target':13} {'c':>3} {'req/s':>8} {'p50 ms':>7} {'CPU µs/req':>10}")
    for c, by_name in runs.items():
        for name, results in by_name.items():
            rps = statistics.median(r.rps for r, _ in results)
            p50 = statistics.median(r.p50_ms for r, _ in results)
            cpu = statistics.median(cpu for _, cpu in results)
            print(f"{name:13} {c:>3} {rps:>8.0f} {p50:>7.2f} {cpu:>10.0f}")
    print("\nmedians of the ratios of runs made side by side (cost: toolset / proxy):")
    proxy_p50_c1 = statistics.median(r.p50_ms for r, _ in runs[1]["proxy"])
    for name in ("toolset", "toolset-2026"):
        pairs = list(zip(runs[64]["proxy"], runs[64][name], strict=True))
        by_rps = statistics.median(p.rps / t.rps for (p, _), (t, _) in pairs)
        by_cpu = statistics.median(tc / pc for (_, pc), (_, tc) in pairs)
        added = statistics.median(
            t.p50_ms - p.p50_ms for (p, _), (t, _) in zip(runs[1]["proxy"], runs[1][name],
                                                          strict=True)
        )  # fmt: skip
        print(
            f"{name:13} c=64 cost by req/s {by_rps:.2f}, by CPU per request {by_cpu:.2f} "
            f"(target 1.25); c=1 p50 added {added:+.2f} ms"
        )
    first = statistics.median(initializes) * 1000
    print(
        f"first request of a new 2025-era session (initialize, {_MEMBERS} members): "
        f"p50 {first:.2f} ms, against {proxy_p50_c1:.2f} ms for a proxied call at c=1"
    )


if __name__ == "__main__":
    main()
