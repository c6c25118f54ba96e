"""Analytics at scale: 10 million tool calls over 30 days, analytics and GET /tool-calls timed.

    python bench/analytics.py [--rows 10000000] [--requests 50] [--seed 1]

One command: starts a private PostgreSQL (CPU 1) and one gateway process (CPU 0) with
GATEWAY_ANALYTICS_CACHE_SECONDS=0.001, signs up one workspace and adds six servers. Loads
`--rows` tool calls with COPY (the secondary indexes of tool_calls are dropped for the load and
built again afterwards, as for any bulk load), spread over the last 30 days with a daily rhythm:
48 tools of very different popularity, latency (lognormal per tool) and error rate, four caller
agents (and calls without one), an incident of a few hours on one server, some calls without a
duration. Then runs `mcp-gateway rollups rebuild`, VACUUM ANALYZE, and times (this process, on
CPU 1, one request at a time):

* every analytics endpoint at days=30, for the workspace and for one server, uncached: the
  response cache lives 1 ms and requests are 10 ms apart, so every answer is computed again
  (the first latency request of a scope is also reported on its own as "first": it finds
  nothing warm in PostgreSQL's buffers);
* GET /tool-calls (first page of 50, with its exact `total`): without a filter and with each
  filter; every total is checked once against count(*).

Prints p50/p95 over `--requests` requests each. Targets: analytics under 50 ms at p95,
GET /tool-calls under 100 ms. Everything runs on 127.0.0.1; what it starts is stopped by PID
and the database directory is deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import OTHERS_CPU, ROOT, Gateway, gateway, postgres

DAYS = 30
SERVERS = {
    "search-api": ["web_search", "news_search", "image_search", "suggest", "answer"],
    "github": ["get_issue", "list_issues", "create_issue", "get_file", "search_code",
               "list_prs", "get_pr", "comment", "create_pr"],
    "postgres": ["query", "list_tables", "describe_table", "explain", "sample_rows",
                 "row_count"],
    "slack": ["post_message", "list_channels", "read_channel", "search_messages",
              "add_reaction", "get_user", "upload_file", "list_users"],
    "filesystem": ["read_file", "write_file", "list_dir", "stat", "search_files", "move",
                   "delete", "mkdir", "read_many", "tree"],
    "browser": ["navigate", "screenshot", "click", "type", "extract_text", "wait_for",
                "evaluate", "pdf", "close", "go_back"],
}  # fmt: skip
AGENTS = np.array(["planner", "coder", "reviewer", "support-bot", "\\N"], dtype=object)
AGENT_WEIGHTS = np.array([0.40, 0.30, 0.15, 0.10, 0.05])
ERRORS = np.array(
    ["upstream returned HTTP 500", "tool raised: timeout after 30 s", "invalid arguments",
     "rate limited by upstream", "upstream unreachable"],
    dtype=object,
)  # fmt: skip
COLUMNS = (
    "id", "workspace_id", "server_id", "tool_name", "caller_agent", "status", "duration_ms",
    "input_tokens", "output_tokens", "output_size_bytes", "error_message", "created_at",
)  # fmt: skip


# -- data ---------------------------------------------------------------------------------------


class Traffic:
    """Which tool on which server, how slow and how often failing: fixed by the seed."""

    def __init__(self, rng: np.random.Generator, server_ids: dict[str, uuid.UUID]) -> None:
        pairs = [(name, tool) for name, tools in SERVERS.items() for tool in tools]
        self.server_of = np.array([str(server_ids[name]) for name, _ in pairs], dtype=object)
        self.server_name = np.array([name for name, _ in pairs], dtype=object)
        self.tool = np.array([tool for _, tool in pairs], dtype=object)
        count = len(pairs)
        # Zipf-like popularity: the busiest tool gets ~50 times the calls of the quietest.
        weights = 1.0 / np.arange(1, count + 1) ** 1.0
        self.popularity = rng.permutation(weights / weights.sum())
        self.median_ms = np.exp(rng.uniform(np.log(8), np.log(2500), count))
        self.sigma = rng.uniform(0.35, 1.1, count)
        self.error_rate = rng.choice([0.002, 0.01, 0.02, 0.05, 0.12], count)
        self.browser = self.server_name == "browser"

    def hour_rows(
        self, rng: np.random.Generator, hour: datetime, n: int, incident: bool, ws: str
    ) -> str:
        """`n` calls inside one hour as COPY text, oldest first."""
        tool = rng.choice(len(self.tool), n, p=self.popularity)
        slow = np.where(incident & self.browser[tool], 4.0, 1.0)
        duration = np.exp(rng.normal(np.log(self.median_ms[tool] * slow), self.sigma[tool]))
        duration = np.minimum(duration, 120_000).astype(np.int64)
        failing = np.where(incident & self.browser[tool], 0.35, self.error_rate[tool])
        error = rng.random(n) < failing
        micros = np.sort(rng.integers(0, 3_600_000_000, n))
        stamps = np.datetime64(hour.replace(tzinfo=None), "us") + micros.astype("timedelta64[us]")
        millis = (stamps.astype("datetime64[ms]").astype(np.int64)).astype(">u8")
        # UUIDv7: 48-bit milliseconds, version 7, RFC variant, random bits.
        raw = np.empty((n, 16), dtype=np.uint8)
        raw[:, :6] = millis.view(np.uint8).reshape(n, 8)[:, 2:]
        raw[:, 6:] = rng.integers(0, 256, (n, 10), dtype=np.uint8)
        raw[:, 6] = 0x70 | (raw[:, 6] & 0x0F)
        raw[:, 8] = 0x80 | (raw[:, 8] & 0x3F)
        hexed = raw.tobytes().hex()
        ids = [hexed[i : i + 32] for i in range(0, 32 * n, 32)]
        durations = duration.astype(str).astype(object)
        durations[rng.random(n) < 0.02] = "\\N"  # ingested without a duration
        messages = np.full(n, "\\N", dtype=object)
        messages[error] = ERRORS[rng.integers(0, len(ERRORS), int(error.sum()))]
        columns = [
            ids,
            [ws] * n,
            self.server_of[tool].tolist(),
            self.tool[tool].tolist(),
            AGENTS[rng.choice(len(AGENTS), n, p=AGENT_WEIGHTS)].tolist(),
            np.where(error, "error", "success").tolist(),
            durations.tolist(),
            rng.integers(20, 4000, n).astype(str).tolist(),
            rng.integers(10, 8000, n).astype(str).tolist(),
            rng.integers(100, 200_000, n).astype(str).tolist(),
            messages.tolist(),
            np.datetime_as_string(stamps, unit="us", timezone="UTC").tolist(),
        ]
        return "".join("\t".join(row) + "\n" for row in zip(*columns, strict=True))


def hourly_counts(rng: np.random.Generator, rows: int, hours: int) -> np.ndarray:
    """Calls per hour: a daily rhythm (busiest mid-afternoon UTC), quieter weekends, noise."""
    index = np.arange(hours)
    daily = 1.0 + 0.8 * np.sin((index % 24 - 9) / 24 * 2 * np.pi)
    weekly = np.where((index // 24) % 7 >= 5, 0.6, 1.0)
    weights = daily * weekly * rng.uniform(0.85, 1.15, hours)
    counts: np.ndarray = np.floor(weights / weights.sum() * rows).astype(np.int64)
    counts[-1] += rows - counts.sum()
    return counts


async def load(gw: Gateway, rows: int, seed: int) -> tuple[list[uuid.UUID], float, float]:
    """COPY the calls; returns the server ids and the seconds taken by COPY and the indexes."""
    rng = np.random.default_rng(seed)
    conn = await asyncpg.connect(gw.dsn)
    try:
        server_ids = {}
        for name in SERVERS:
            server_ids[name] = await conn.fetchval(
                "INSERT INTO servers (workspace_id, name, url) VALUES ($1, $2, $3) RETURNING id",
                gw.workspace_id,
                name,
                f"http://127.0.0.1:9/{name}",
            )
        traffic = Traffic(rng, server_ids)
        hours = DAYS * 24
        now = datetime.now(UTC)
        first = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
        counts = hourly_counts(rng, rows, hours)
        incident = set(range(hours - 100, hours - 96))

        async def chunks() -> AsyncIterator[bytes]:
            done = 0
            for h in range(hours):
                hour = first + timedelta(hours=h)
                text = traffic.hour_rows(
                    rng, hour, int(counts[h]), h in incident, str(gw.workspace_id)
                )
                done += int(counts[h])
                if h % 72 == 71:
                    print(f"  {done:,} rows", flush=True)
                yield text.encode()

        copying, indexing = await bulk_load(conn, chunks())
    finally:
        await conn.close()
    return list(server_ids.values()), copying, indexing


async def bulk_load(conn: asyncpg.Connection, chunks: AsyncIterator[bytes]) -> tuple[float, float]:
    """COPY rows (text format, COLUMNS) into tool_calls with its secondary indexes dropped,
    then rebuilt: seconds copying, seconds indexing."""
    indexes = await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'tool_calls' "
        "AND indexname <> 'tool_calls_pkey'"
    )
    for index in indexes:
        await conn.execute(f"DROP INDEX {index['indexname']}")
    started = time.monotonic()
    await conn.copy_to_table("tool_calls", source=chunks, columns=COLUMNS, format="text")
    copied = time.monotonic()
    await conn.execute("SET maintenance_work_mem = '512MB'")
    for index in indexes:
        # A partitioned table's index reads "ON ONLY tool_calls": that would make the parent's
        # index alone, none on the partitions.
        await conn.execute(index["indexdef"].replace(" ON ONLY ", " ON ", 1))
    await conn.execute("ANALYZE tool_calls")
    return copied - started, time.monotonic() - copied


def rebuild_rollups(dsn: str) -> float:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "rollups", "rebuild"],
        env={**os.environ, "DATABASE_URL": dsn},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"rollups rebuild failed:\n{result.stderr}")
    print(f"  {result.stdout.strip()}")
    return time.monotonic() - started


# -- timing -------------------------------------------------------------------------------------


async def timed(
    http: aiohttp.ClientSession, path: str, params: dict[str, Any], requests: int
) -> tuple[list[float], Any]:
    """Milliseconds of `requests` sequential GETs, 10 ms apart (past the 1 ms cache)."""
    times = []
    body: Any = None
    for _ in range(requests):
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        async with http.get(path, params=params) as response:
            body = await response.json()
            if response.status != 200:
                raise RuntimeError(f"GET {path} {params}: {response.status} {body}")
        times.append((time.perf_counter() - started) * 1000)
    return times, body


def summary(times: list[float]) -> str:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"p50 {statistics.median(ordered):7.1f} ms   p95 {p95:7.1f} ms"


async def measure(gw: Gateway, server_id: uuid.UUID, requests: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    headers = {"X-API-Key": gw.key}
    async with aiohttp.ClientSession(gw.url, headers=headers) as http:
        for scope, extra in (("workspace", {}), ("one server", {"server_id": str(server_id)})):
            params = {"days": "30", **extra}
            first, _ = await timed(http, "/api/v1/analytics/latency", params, 1)
            results[f"latency, {scope}, first"] = first
            for endpoint in ("top-tools", "error-rates", "latency", "volume"):
                times, body = await timed(http, f"/api/v1/analytics/{endpoint}", params, requests)
                if endpoint != "top-tools":
                    assert len(body) == DAYS * 24, len(body)
                results[f"{endpoint}, {scope}"] = times
        start = (datetime.now(UTC) - timedelta(days=7, minutes=17)).isoformat()
        end = (datetime.now(UTC) - timedelta(days=1, minutes=42)).isoformat()
        filters: list[tuple[str, dict[str, str]]] = [
            ("no filter", {}),
            ("server_id", {"server_id": str(server_id)}),
            ("tool_name=search", {"tool_name": "search"}),
            ("status=error", {"status": "error"}),
            ("caller_agent=coder", {"caller_agent": "coder"}),
            ("start (7 days ago)", {"start": start}),
            ("start + end", {"start": start, "end": end}),
        ]
        conn = await asyncpg.connect(gw.dsn)
        try:
            for label, params in filters:
                times, body = await timed(http, "/api/v1/tool-calls", params, requests)
                results[f"tool-calls, {label}"] = times
                exact = await count(conn, gw.workspace_id, params)
                if body["total"] != exact:
                    raise RuntimeError(f"{label}: total {body['total']} != count(*) {exact}")
        finally:
            await conn.close()
    return results


# How each GET /tool-calls filter reads as SQL, for checking totals with count(*).
_CONDITIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "server_id": ("server_id = ${n}", uuid.UUID),
    "tool_name": ("tool_name ILIKE ${n}", lambda v: f"%{v}%"),
    "status": ("status = ${n}", str),
    "caller_agent": ("caller_agent = ${n}", str),
    "start": ("created_at >= ${n}", datetime.fromisoformat),
    "end": ("created_at <= ${n}", datetime.fromisoformat),
}


async def count(conn: asyncpg.Connection, workspace_id: uuid.UUID, params: dict[str, str]) -> int:
    """The exact total the slow way."""
    where = ["workspace_id = $1"]
    args: list[Any] = [workspace_id]
    for name, value in params.items():
        condition, convert = _CONDITIONS[name]
        args.append(convert(value))
        where.append(condition.format(n=len(args)))
    total: int = await conn.fetchval(
        f"SELECT count(*) FROM tool_calls WHERE {' AND '.join(where)}", *args
    )
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--requests", type=int, default=50, help="per endpoint and parameters")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    settings = {"GATEWAY_ANALYTICS_CACHE_SECONDS": "0.001", "GATEWAY_RUN_WORKERS": "false"}
    with postgres() as dsn, gateway(dsn, settings) as gw:
        print(f"loading {args.rows:,} tool calls over {DAYS} days")
        servers, copy_s, index_s = asyncio.run(load(gw, args.rows, args.seed))
        print(f"  COPY {copy_s:.0f} s ({args.rows / copy_s:,.0f} rows/s), indexes {index_s:.0f} s")
        print("rollups rebuild")
        rebuild_s = rebuild_rollups(dsn)
        print(f"  {rebuild_s:.1f} s")
        started = time.monotonic()
        asyncio.run(vacuum(dsn))
        print(f"VACUUM ANALYZE {time.monotonic() - started:.0f} s")
        # Loading may use both CPUs (the gateway idles meanwhile); the timed client shares
        # PostgreSQL's.
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {int(OTHERS_CPU)})
        results = asyncio.run(measure(gw, servers[0], args.requests))
    print(f"\n{'request (days=30 for analytics)':44} {'(' + str(args.requests) + ' each)':>10}")
    for label, times in results.items():
        print(f"{label:44} {summary(times)}")
    print("\ntargets: analytics p95 < 50 ms (uncached), GET /tool-calls p95 < 100 ms")


async def vacuum(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM ANALYZE tool_calls")
        await conn.execute("VACUUM ANALYZE tool_call_hourly")
    finally:
        await conn.close()


if __name__ == "__main__":
    main()
