"""Ten minutes of the mixed locust profile against `serve --workers 2`: memory, errors, the log.

    python bench/soak.py [--minutes 10] [--users 40] [--workers 2] [--csv bench/results/soak]

Starts a private PostgreSQL, a stateless JSON upstream and the gateway, signs up an owner with
an API key and a server, then runs locust headless (bench/locustfile.py: agents through the
proxy, ingestion in arrays, REST reads, dashboard pages). Every 10 s it reads the resident
memory of each gateway process. At the end it stops the gateway (SIGTERM: each worker drains
its call log) and checks that every call the gateway acknowledged (a proxied tools/call
answered 200, an ingested row answered 201) is in tool_calls. Writes locust's summary
(`<csv>_stats.csv`, `<csv>_failures.csv`) and the memory samples (`<csv>_rss.csv`); exits 1 on
a failed request, a lost call or a process over --rss-limit MB.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    BENCH_PASSWORD,
    ROOT,
    Gateway,
    _account,
    free_port,
    postgres,
    process,
)

SAMPLE_SECONDS = 10.0
# Rows per POST /tool-calls, passed to the locustfile (which must not be imported here: locust
# patches the standard library with gevent on import).
INGEST_ROWS = 100


def family(pid: int) -> list[int]:
    """The process and its descendants (the supervisor's workers)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            children = (
                (task / "children").read_text().split() if (task / "children").exists() else []
            )
            todo.extend(int(c) for c in children)
    return found


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def sample_memory(root: int, rows: list[tuple[float, int, float]], stop: threading.Event) -> None:
    started = time.monotonic()
    while not stop.wait(SAMPLE_SECONDS if rows else 1.0):
        now = round(time.monotonic() - started, 1)
        for pid in family(root):
            mb = rss_mb(pid)
            if mb is not None:
                rows.append((now, pid, round(mb, 1)))


def locust_totals(final_json: Path) -> dict[str, tuple[int, int]]:
    """name -> (requests, failures) from locust's final stats (its CSV is written every second,
    so it may miss the last one)."""
    totals: dict[str, tuple[int, int]] = {}
    for entry in json.loads(final_json.read_text()):  # a name may come with two methods
        requests, failures = totals.get(entry["name"], (0, 0))
        totals[entry["name"]] = (requests + entry["num_requests"], failures + entry["num_failures"])
    totals["Aggregated"] = (sum(r for r, _ in totals.values()), sum(f for _, f in totals.values()))
    return totals


async def count_calls(gw: Gateway) -> int:
    return await gw.count_calls()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--workers", default="2")
    parser.add_argument("--csv", default=str(ROOT / "bench" / "results" / "soak"))
    parser.add_argument("--rss-limit", type=float, default=150.0, help="MB per process")
    args = parser.parse_args()
    prefix = Path(args.csv)
    prefix.parent.mkdir(parents=True, exist_ok=True)

    upstream_port, port = free_port(), free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    upstream = [sys.executable, str(ROOT / "bench" / "proxy.py"), "--role", "upstream"]
    env = {
        "GATEWAY_JWT_SECRET": "bench-" + "x" * 40,
        "GATEWAY_SECRET_KEYS": "",
        "GATEWAY_AUTH_RATE_LIMIT": "100000/minute",
        "GATEWAY_PUBLIC_URL": f"http://127.0.0.1:{port}",
    }
    from cryptography.fernet import Fernet

    env["GATEWAY_SECRET_KEYS"] = Fernet.generate_key().decode()
    serve = [sys.executable, "-m", "gateway", "serve", "--port", str(port)]
    serve += ["--workers", args.workers]
    memory: list[tuple[float, int, float]] = []
    stop = threading.Event()
    with postgres() as dsn, process([*upstream, "--port", str(upstream_port)], upstream_port):
        with process(serve, port, {**env, "DATABASE_URL": dsn}) as pid:
            url = f"http://127.0.0.1:{port}"
            key, workspace_id, email = asyncio.run(_account(url))
            gw = Gateway(url, dsn, key, workspace_id, env["GATEWAY_SECRET_KEYS"], pid, email)
            server_id = asyncio.run(gw.add_server(upstream_url))
            sampler = threading.Thread(target=sample_memory, args=(pid, memory, stop))
            sampler.start()
            locust = [
                sys.executable, "-m", "locust", "-f", str(ROOT / "bench" / "locustfile.py"),
                "--host", url, "--headless", "-u", str(args.users), "-r", str(args.users),
                "-t", f"{int(args.minutes * 60)}s", "--stop-timeout", "10",
                "--csv", str(prefix), "--json-file", f"{prefix}_final",
                "--only-summary", "--loglevel", "WARNING",
            ]  # fmt: skip
            locust_env = {
                **os.environ,
                "BENCH_API_KEY": key,
                "BENCH_SERVER_ID": str(server_id),
                "BENCH_EMAIL": email,
                "BENCH_PASSWORD": BENCH_PASSWORD,
                "BENCH_INGEST_ROWS": str(INGEST_ROWS),
            }
            subprocess.run(locust, env=locust_env, cwd=ROOT, check=False)
            stop.set()
            sampler.join()
        # The gateway has stopped (SIGTERM, drained): everything acknowledged is stored.
        logged = asyncio.run(count_calls(gw))
    for extra in ("_stats_history.csv", "_exceptions.csv"):
        Path(f"{prefix}{extra}").unlink(missing_ok=True)

    final = Path(f"{prefix}_final.json")
    totals = locust_totals(final)
    final.unlink()  # response-time histograms: the CSV summary is what is kept
    requests, failures = totals.get("Aggregated", (0, 0))
    proxied = totals.get("proxy tools/call", (0, 0))
    ingested = totals.get(f"ingest x{INGEST_ROWS}", (0, 0))
    acknowledged = (proxied[0] - proxied[1]) + INGEST_ROWS * (ingested[0] - ingested[1])
    with Path(f"{prefix}_rss.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["seconds", "pid", "rss_mb"])
        writer.writerows(memory)

    print(f"requests {requests}, failures {failures}")
    print(f"acknowledged calls {acknowledged}, in tool_calls {logged}")
    over = False
    for pid in sorted({p for _, p, _ in memory}):
        series = [(t, mb) for t, p, mb in memory if p == pid]
        first_minute = [mb for t, mb in series if t <= 60] or [series[0][1]]
        last_minute = [mb for t, mb in series if t >= series[-1][0] - 60]
        peak = max(mb for _, mb in series)
        over |= peak > args.rss_limit
        print(
            f"pid {pid}: RSS first minute {max(first_minute):.1f} MB, "
            f"last minute {max(last_minute):.1f} MB, peak {peak:.1f} MB"
        )
    # A proxied call answered just as locust stopped counting is logged but not counted.
    lost = logged < acknowledged or logged > acknowledged + args.users
    if failures or lost or over:
        print("FAILED:", "request failures" if failures else "", "lost calls" if lost else "",
              "memory over the limit" if over else "")  # fmt: skip
        raise SystemExit(1)
    print("OK: no failure, no call lost, memory within the limit")


if __name__ == "__main__":
    main()
