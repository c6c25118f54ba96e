"""Throughput of `serve --workers 2` against `--workers 1`, on the same cores as the load.

    python bench/workers.py [--seconds 5] [--runs 3] [--connections 64]

One command: a private PostgreSQL, the cheap stateless-JSON MCP upstream of bench/proxy.py, and
two gateways on that database, one with GATEWAY_WORKERS=1 and one with GATEWAY_WORKERS=2 (API
key, every call logged); wrk posts tools/call through each in turn (runs interleaved: 1, 2, 1,
2, ...). Nothing is pinned: the gateway's workers, the upstream, wrk and PostgreSQL share every
core this process may use, as they would on one small host, so the ratio says what a second
worker buys when the load generator competes for the same CPUs. Prints req/s and p50/p99 per
setting (median of the runs), the ratio, and checks that every answered call was logged.
Everything runs on 127.0.0.1 and is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp

from bench import harness
from bench.harness import (
    Gateway,
    WrkResult,
    free_port,
    gateway,
    logged,
    median_result,
    pinned,
    postgres,
    process,
    wrk,
)

PROXY_BENCH = Path(__file__).with_name("proxy.py")
# Every core this process may use, for everything: the harness pins the gateway to one CPU and
# the rest to the other, which would give both settings the same single core for the gateway.
CPUS = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))
SETTINGS = {"workers 1": "1", "workers 2": "2"}
STARTUP_SECONDS = 60.0


async def all_workers_up(url: str, count: int) -> None:
    """Until /healthz has answered from each of `count` workers (new connection each time)."""
    seen: set[int] = set()
    deadline = time.monotonic() + STARTUP_SECONDS
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(url, connector=connector) as http:
        while len(seen) < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"only workers {sorted(seen)} of {count} answer at {url}")
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get("/healthz") as response:
                    seen.add((await response.json())["worker"])
            await asyncio.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=5, help="per wrk run")
    parser.add_argument("--runs", type=int, default=3, help="runs per setting")
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    harness.GATEWAY_CPU = harness.OTHERS_CPU = CPUS  # read by the harness at each start
    upstream_port = free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    upstream = [
        sys.executable,
        str(PROXY_BENCH),
        "--role",
        "upstream",
        "--port",
        str(upstream_port),
    ]
    runs: dict[str, list[WrkResult]] = {name: [] for name in SETTINGS}
    checks: list[tuple[str, int, int]] = []
    with (
        postgres() as dsn,
        process(pinned(CPUS, upstream), upstream_port),
        gateway(dsn, {"GATEWAY_WORKERS": SETTINGS["workers 1"]}) as one,
        gateway(dsn, {"GATEWAY_WORKERS": SETTINGS["workers 2"]}) as two,
    ):
        gateways: dict[str, Gateway] = {"workers 1": one, "workers 2": two}
        asyncio.run(all_workers_up(two.url, 2))
        targets: dict[str, tuple[str, str, uuid.UUID]] = {}
        for name, gw in gateways.items():
            server_id = asyncio.run(gw.add_server(upstream_url))
            targets[name] = (f"{gw.url}/api/v1/proxy/{server_id}/mcp", gw.key, server_id)
        for url, key, _ in targets.values():  # warm up connections and caches
            wrk(url, args.connections, 2, key)
        before = {name: asyncio.run(logged(dsn, sid)) for name, (_, _, sid) in targets.items()}
        for _ in range(args.runs):
            # Interleaved: this VM's speed drifts within minutes; runs side by side compare.
            for name, (url, key, _) in targets.items():
                runs[name].append(wrk(url, args.connections, args.seconds, key))
                print(f"{name:10} {runs[name][-1]}", file=sys.stderr)
        for name, (_, _, server_id) in targets.items():
            answered = sum(r.requests for r in runs[name])
            deadline = time.monotonic() + 30
            count = 0
            while time.monotonic() < deadline:
                count = asyncio.run(logged(dsn, server_id)) - before[name]
                if count >= answered:
                    break
                time.sleep(0.5)
            checks.append((name, answered, count))
    report(runs, args.connections)
    ok = True
    for name, answered, count in checks:
        # wrk stops counting at its deadline, so a few calls in flight then are logged too.
        fine = answered <= count <= answered + args.connections * args.runs
        ok = ok and fine
        print(f"{name}: {answered} answered, {count} logged: {'OK' if fine else 'MISMATCH'}")
    if not ok:
        raise SystemExit(1)


def report(runs: dict[str, list[WrkResult]], connections: int) -> None:
    print(f"\nc={connections}, cores shared by everything: {CPUS}")
    print(f"{'setting':10} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for name, results in runs.items():
        r = median_result(results)
        print(
            f"{name:10} {r['rps']:>9.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
            f"{r['errors']:>6.0f}"
        )
    paired = [
        two.rps / one.rps for one, two in zip(runs["workers 1"], runs["workers 2"], strict=True)
    ]
    print(
        f"\nworkers 2 / workers 1 req/s: {statistics.median(paired):.2f} "
        f"(median of {len(paired)} side-by-side runs: {', '.join(f'{p:.2f}' for p in paired)})"
    )


if __name__ == "__main__":
    main()
