"""Ingestion throughput: rows per second through POST /tool-calls in arrays of 500.

    python bench/ingest.py [--seconds 10] [--batch 500] [--concurrency 32] [--runs 3]

Starts a private PostgreSQL and one gateway process (CPU 0; this load generator and PostgreSQL
on CPU 1), then posts arrays of tool calls from 32 concurrent connections (each waits for its
commit, so fewer clients measure commit latency rather than throughput). A 201 means the
rows are committed, so rows/s counts durable rows. Target: 50,000 rows/s. Checks at the end that
the database holds exactly the rows acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import OTHERS_CPU, Gateway, gateway, postgres


async def run(gw: Gateway, seconds: float, batch: int, concurrency: int) -> tuple[int, float]:
    server_id = await gw.add_server("http://127.0.0.1:9/mcp")
    tools = ["search", "fetch", "summarise", "translate", "lookup"]
    bodies = [
        orjson.dumps(
            [
                {
                    "server_id": str(server_id),
                    "tool_name": tools[(i + j) % len(tools)],
                    "status": "error" if (i + j) % 20 == 0 else "success",
                    "caller_agent": "bench",
                    "duration_ms": (i * 7 + j * 13) % 3000,
                    "input_tokens": 100,
                    "output_tokens": 250,
                    "output_size_bytes": 1024,
                }
                for j in range(batch)
            ]
        )
        for i in range(16)
    ]
    headers = {"X-API-Key": gw.key, "Content-Type": "application/json"}
    acknowledged = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(gw.url, headers=headers, connector=connector) as http:

        async def client(n: int, until: float) -> None:
            nonlocal acknowledged
            i = n
            while time.monotonic() < until:
                async with http.post("/api/v1/tool-calls", data=bodies[i % len(bodies)]) as r:
                    await r.read()
                    if r.status != 201:
                        raise RuntimeError(f"POST /tool-calls answered {r.status}")
                acknowledged += batch
                i += concurrency

        await asyncio.gather(*(client(n, time.monotonic() + 2) for n in range(concurrency)))
        acknowledged = 0  # the warm-up does not count
        started = time.monotonic()
        until = started + seconds
        await asyncio.gather(*(client(n, until) for n in range(concurrency)))
        elapsed = time.monotonic() - started
    return acknowledged, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(OTHERS_CPU)})
    rates = []
    with postgres() as dsn, gateway(dsn) as gw:
        before = asyncio.run(gw.count_calls())
        total = 0
        for i in range(args.runs):
            rows, elapsed = asyncio.run(run(gw, args.seconds, args.batch, args.concurrency))
            rates.append(rows / elapsed)
            total += rows
            print(f"run {i + 1}: {rows} rows in {elapsed:.1f} s = {rows / elapsed:,.0f} rows/s")
        stored = asyncio.run(gw.count_calls()) - before
    print(f"\nmedian: {statistics.median(rates):,.0f} rows/s (target 50,000)")
    # Warm-up rows are stored too: the check is that nothing acknowledged is missing.
    print(f"acknowledged (timed) rows: {total}, stored: {stored}", end=" ")
    print("OK" if stored >= total else "MISSING ROWS")


if __name__ == "__main__":
    main()
