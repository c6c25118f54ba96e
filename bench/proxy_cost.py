"""What one proxied call costs the process under test: CPU µs, or instructions, per request.

    python bench/proxy_cost.py [--runs 5] [--seconds 4]        # CPU µs per request under wrk c=64
    python bench/proxy_cost.py --callgrind [--requests 2000]   # instructions per request
    python bench/proxy_cost.py --callgrind --governed          # with rules the calls pass

Throughput on this VM drifts; these two do not, or much less, so they show whether a change to
the hot path helps. The first runs the pass-through and the gateway of bench/proxy.py side by
side under wrk and divides each process's CPU time (/proc/<pid>/stat) by the requests it served.
The second runs each under `valgrind --tool=callgrind` (apt-get install valgrind), counts
instructions only while exactly --requests calls are sent (16 at a time, after a warm-up), and
divides: repeatable to about 1 %. Under valgrind the gateway runs ~50 times slower, so its call
log writes smaller batches than in real time: the count overstates the log's per-batch cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    GATEWAY_CPU,
    free_port,
    gateway,
    mcp_upstream,
    pinned,
    postgres,
    process,
    wrk,
)

_PROXY = str(Path(__file__).resolve().parent / "proxy.py")
_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "User-Agent": "mcp-bench/1.0",
    "MCP-Protocol-Version": "2025-06-18",
    "X-Caller-Agent": "bench",
}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def send(url: str, key: str, count: int, concurrency: int = 16) -> None:
    """Exactly `count` tools/call requests, `concurrency` at a time."""
    import aiohttp

    headers = {**_HEADERS, **({"X-API-Key": key} if key else {})}
    ids = iter(range(count))
    async with aiohttp.ClientSession() as http:

        async def worker() -> None:
            for i in ids:
                body = (
                    b'{"jsonrpc":"2.0","id":%d,"method":"tools/call",'
                    b'"params":{"name":"echo","arguments":{"text":"hello"}}}' % i
                )
                async with http.post(url, data=body, headers=headers) as reply:
                    await reply.read()
                    assert reply.status == 200, reply.status

        await asyncio.gather(*(worker() for _ in range(concurrency)))


@contextlib.contextmanager
def targets(
    callgrind: str | None, governed: bool = False
) -> Iterator[dict[str, tuple[str, str, int]]]:
    """name -> (url, API key, pid) for the pass-through and the gateway, optionally each under
    callgrind (instrumentation off until switched on)."""
    grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no"] if callgrind else []
    pass_port = free_port()
    out = [] if callgrind is None else [f"--callgrind-out-file={callgrind}.%p"]
    passthrough = [*grind, *out, sys.executable, _PROXY, "--role", "passthrough"]
    with (
        postgres() as dsn,
        mcp_upstream() as upstream,
        process(
            pinned(GATEWAY_CPU, [*passthrough, "--port", str(pass_port), "--upstream", upstream]),
            pass_port,
            startup_seconds=600,
        ) as pass_pid,
        gateway(dsn, wrapper=[*grind, *out], startup_seconds=600) as gw,
    ):
        server_id = asyncio.run(gw.add_server(upstream))
        if governed:
            asyncio.run(gw.govern(server_id))
        yield {
            "pass-through": (f"http://127.0.0.1:{pass_port}/mcp", "", pass_pid),
            "gateway": (f"{gw.url}/api/v1/proxy/{server_id}/mcp", gw.key, gw.pid),
        }


def cpu_per_request(runs: int, seconds: float, governed: bool) -> None:
    with targets(None, governed) as by_name:
        for url, key, _ in by_name.values():
            wrk(url, 16, 2, key)  # warm-up
        costs: dict[str, list[float]] = {name: [] for name in by_name}
        for _ in range(runs):
            for name, (url, key, pid) in by_name.items():
                before = cpu_seconds(pid)
                result = wrk(url, 64, seconds, key)
                time.sleep(0.3)  # the last calls' share of the call log
                costs[name].append((cpu_seconds(pid) - before) / result.requests * 1e6)
    for name, values in costs.items():
        print(f"{name:13} {statistics.median(values):6.1f} µs CPU per request (runs: "
              f"{', '.join(f'{v:.0f}' for v in values)})")  # fmt: skip
    ratio = statistics.median(
        p / g for p, g in zip(costs["pass-through"], costs["gateway"], strict=True)
    )
    print(f"pass-through / gateway: {ratio:.3f}")


def instructions_per_request(requests: int, governed: bool) -> None:
    out = f"/tmp/mcpg-callgrind-{os.getpid()}"
    with targets(out, governed) as by_name:
        pids = {name: pid for name, (_, _, pid) in by_name.items()}
        for url, key, pid in by_name.values():
            asyncio.run(send(url, key, 300))  # warm-up
            time.sleep(2)
            subprocess.run(
                ["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True
            )
            asyncio.run(send(url, key, requests))
            time.sleep(3)  # let the call log write them
            subprocess.run(
                ["callgrind_control", "-i", "off", str(pid)], check=True, capture_output=True
            )
    # The totals are written when each process exits (above, stopped by PID).
    for name, pid in pids.items():
        path = Path(f"{out}.{pid}")
        lines = path.read_text().splitlines()
        total = max(
            int(line.split()[1]) for line in lines if line.startswith(("summary:", "totals:"))
        )
        print(f"{name:13} {total / requests:>10,.0f} instructions per request")
        path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--callgrind", action="store_true", help="count instructions instead")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument(
        "--governed",
        action="store_true",
        help="the key and server with rules the calls pass (allowed tools, rate limits)",
    )
    args = parser.parse_args()
    if args.callgrind:
        instructions_per_request(args.requests, args.governed)
    else:
        cpu_per_request(args.runs, args.seconds, args.governed)


if __name__ == "__main__":
    main()
