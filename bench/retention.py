"""Retention at scale: dropping one day of tool calls from the 10-million-call database, and the
proxy's latency meanwhile.

    python bench/retention.py [--rows 10000000] [--seconds 4] [--connections 16] [--migration]
                              [--admin-dsn postgresql://postgres@127.0.0.1:5432/postgres] [--keep]

One command: creates the database `mcpg_bench_retention` on the local PostgreSQL (`--admin-dsn`;
dropped at the end unless `--keep`), starts a cheap MCP upstream (CPU 1) and one gateway
process (CPU 0, GATEWAY_RUN_WORKERS=false: only this script drops days), signs up one workspace.
Loads `--rows` tool calls with COPY, the traffic of bench/analytics.py (secondary indexes
dropped for the load and built again): 330,000 on the day 31 days ago, 3,300,000 on the day 30
days ago, the rest over the 30 days since, up to this hour. Then, with wrk driving tools/call
through the proxy (every call logged into today's partition), for `--seconds` each:

* no drop (before, between and after the drops): p50 and p99;
* a drop starting 1 s into the run: `partitions.drop_expired()`, as the retention loop runs it
  (DETACH PARTITION ... CONCURRENTLY, then DROP TABLE), of the 330,000-call day, then of the
  3,300,000-call day: its wall time, and the run's p50 and p99.

Checks that the dropped days are gone, the other calls all there, and that the gateway logged
every proxied call (none lost to the drops). Prints a table.

With `--migration`, then empties the database and times migration 5 converting a tool_calls
table of schema version 4 holding the same `--rows` calls (the old table becomes the first
partition, not rewritten; writers of tool_calls wait for it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.analytics import SERVERS, Traffic, bulk_load, hourly_counts
from bench.harness import (
    OTHERS_CPU,
    WrkResult,
    free_port,
    gateway,
    logged,
    pinned,
    process,
    wrk,
)
from bench.proxy import serve_upstream
from gateway.db import partitions
from gateway.db.partitions import DAY, floor_day
from gateway.db.schema import migrations

T = TypeVar("T")

DATABASE = "mcpg_bench_retention"
# Version 4 of the schema, the one before tool_calls was partitioned (for --migration).
V1 = Path(__file__).resolve().parent.parent / "tests" / "db" / "schema_v1.sql"
# The calls of the two days dropped (`--days`).
SMALL_DAY = 330_000
BIG_DAY = 3_300_000


def with_database(dsn: str, name: str) -> str:
    base, _, _ = dsn.rpartition("/")
    return f"{base}/{name}"


async def recreate_database(admin_dsn: str, drop_only: bool = False) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        if not drop_only:
            await conn.execute(f"CREATE DATABASE {DATABASE}")
    finally:
        await conn.close()


async def load(
    dsn: str, workspace_id: uuid.UUID, rows: int, sizes: tuple[int, int], seed: int
) -> tuple[datetime, float, float]:
    """COPY the calls; returns the first day's start and the seconds taken by COPY and indexes."""
    rng = np.random.default_rng(seed)
    today = floor_day(datetime.now(UTC))
    small, big = today - 31 * DAY, today - 30 * DAY
    conn = await asyncpg.connect(dsn)
    try:
        server_ids = {}
        for name in SERVERS:
            server_ids[name] = await conn.fetchval(
                "INSERT INTO servers (workspace_id, name, url) VALUES ($1, $2, $3) RETURNING id",
                workspace_id,
                name,
                f"http://127.0.0.1:9/{name}",
            )
        traffic = Traffic(rng, server_ids)
        if await conn.fetchval("SELECT relkind = 'p' FROM pg_class WHERE relname = 'tool_calls'"):
            # The gateway made the partitions of the 30 days its retention keeps; the day
            # before them stands for one that retention has not dropped yet.
            await partitions.create_days(conn, [small])
        first_rest = today - 29 * DAY
        now_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        rest_hours = int((now_hour - first_rest) / timedelta(hours=1)) + 1
        plan = [(small + timedelta(hours=h), int(n)) for h, n in enumerate(
            hourly_counts(rng, sizes[0], 24))]  # fmt: skip
        plan += [(big + timedelta(hours=h), int(n)) for h, n in enumerate(
            hourly_counts(rng, sizes[1], 24))]  # fmt: skip
        rest = hourly_counts(rng, rows - sum(sizes), rest_hours)
        plan += [(first_rest + timedelta(hours=h), int(n)) for h, n in enumerate(rest)]

        async def chunks() -> AsyncIterator[bytes]:
            done = 0
            for h, (hour, n) in enumerate(plan):
                yield traffic.hour_rows(rng, hour, n, False, str(workspace_id)).encode()
                done += n
                if h % 120 == 119:
                    print(f"  {done:,} rows", flush=True)

        copying, indexing = await bulk_load(conn, chunks())
    finally:
        await conn.close()
    return small, copying, indexing


async def time_migration(
    dsn: str, rows: int, sizes: tuple[int, int], seed: int
) -> tuple[float, float]:
    """In the (empty) database `dsn`: schema version 4 with `rows` calls, then migration 5 as
    the gateway applies it (one transaction: writers of tool_calls wait meanwhile) and the
    partitions of the days kept; returns the seconds of each."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(V1.read_text())
        for number, sql in migrations():
            if number <= 4:
                await conn.execute(sql)
        await conn.execute("INSERT INTO schema_version (version) VALUES (4)")
        workspace_id = await conn.fetchval(
            "INSERT INTO workspaces (name, slug) VALUES ('Bench', 'bench') RETURNING id"
        )
    finally:
        await conn.close()
    print(f"loading {rows:,} tool calls into schema version 4")
    await load(dsn, workspace_id, rows, sizes, seed)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM ANALYZE tool_calls")
        started = time.perf_counter()
        async with conn.transaction():
            await conn.execute(dict(migrations())[5])
        migrated = time.perf_counter()
        await partitions.create_ahead(conn, datetime.now(UTC), partitions.DEFAULT_KEEP_DAYS)
        made = time.perf_counter()
        kinds = await conn.fetchval(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'tool_calls'::regclass"
        )
        assert kinds >= 2, "tool_calls is not partitioned"
        assert await conn.fetchval("SELECT count(*) FROM tool_calls") == rows
    finally:
        await conn.close()
    return migrated - started, made - migrated


async def day_counts(dsn: str, proxied: uuid.UUID | None = None) -> dict[str, int]:
    """Calls per partition (but those of the server `proxied`)."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT tableoid::regclass::text AS part, count(*) FROM tool_calls "
            "WHERE server_id IS DISTINCT FROM $1 GROUP BY 1",
            proxied,
        )
    finally:
        await conn.close()
    return {row["part"]: row["count"] for row in rows}


class Steps(logging.Handler):
    """Keeps what gateway.db.partitions logs of each drop: the detach's and the DROP's times."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def drop_day(dsn: str, day: datetime, delay: float) -> tuple[list[str], float]:
    """After `delay` s, drop the partitions expired by a retention reaching back to the day
    after `day` (just `day`); returns their names and the seconds the drop took."""
    conn = await asyncpg.connect(dsn)
    try:
        await asyncio.sleep(delay)
        # 'now' two hours into a day, so that `day` is past the retention and its GRACE.
        today = floor_day(datetime.now(UTC))
        keep_days = (today - day) // DAY - 1
        started = time.perf_counter()
        dropped = await partitions.drop_expired(conn, today + timedelta(hours=2), keep_days)
        return dropped, time.perf_counter() - started
    finally:
        await conn.close()


def wrk_during(
    url: str, connections: int, seconds: int, key: str, work: Coroutine[Any, Any, T]
) -> tuple[WrkResult, T]:
    """A wrk run (in another thread) with `work` run meanwhile in this one; both results."""
    result: list[WrkResult] = []
    thread = threading.Thread(target=lambda: result.append(wrk(url, connections, seconds, key)))
    thread.start()
    try:
        outcome = asyncio.run(work)
    finally:
        thread.join()
    return result[0], outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--seconds", type=int, default=4, help="per wrk run")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--days", default=f"{SMALL_DAY},{BIG_DAY}", help="the two days' calls")
    parser.add_argument("--admin-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--keep", action="store_true", help=f"keep the database {DATABASE}")
    parser.add_argument(
        "--migration",
        action="store_true",
        help="also time migration 5 converting a table of --rows calls (in the same database, "
        "emptied first)",
    )
    parser.add_argument("--role", choices=["upstream"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "upstream":
        serve_upstream(args.port)
        return
    small_calls, big_calls = (int(n) for n in args.days.split(","))
    if args.rows <= small_calls + big_calls:
        raise SystemExit("--rows must be more than the two days' calls")
    dsn = with_database(args.admin_dsn, DATABASE)
    asyncio.run(recreate_database(args.admin_dsn))
    upstream_port = free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    me = [sys.executable, __file__, "--role", "upstream", "--port", str(upstream_port)]
    table: list[tuple[str, str, WrkResult]] = []
    steps = Steps()
    partitions.log.addHandler(steps)
    partitions.log.setLevel(logging.INFO)
    try:
        with (
            process(pinned(OTHERS_CPU, me), upstream_port),
            gateway(dsn, {"GATEWAY_RUN_WORKERS": "false"}) as gw,
        ):
            print(f"loading {args.rows:,} tool calls")
            small, copy_s, index_s = asyncio.run(
                load(gw.dsn, gw.workspace_id, args.rows, (small_calls, big_calls), args.seed)
            )
            print(f"  COPY {copy_s:.0f} s, indexes and ANALYZE {index_s:.0f} s")
            big = small + DAY
            before = asyncio.run(day_counts(dsn))
            print(f"  {before[partitions.day_name(small)]:,} calls on {small:%Y-%m-%d}, "
                  f"{before[partitions.day_name(big)]:,} on {big:%Y-%m-%d}")  # fmt: skip
            server_id = asyncio.run(gw.add_server(upstream_url))
            url, key = f"{gw.url}/api/v1/proxy/{server_id}/mcp", gw.key
            c, seconds = args.connections, args.seconds
            runs = [wrk(url, c, 2, key)]  # warm-up
            runs.append(wrk(url, c, seconds, key))
            table.append(("no drop", "", runs[-1]))
            for day in (small, big):
                calls = before[partitions.day_name(day)]
                work = drop_day(dsn, day, 1.0)
                during, (dropped, took) = wrk_during(url, c, seconds, key, work)
                if dropped != [partitions.day_name(day)]:
                    raise RuntimeError(f"dropped {dropped}, not the day {day:%Y-%m-%d}")
                table.append((f"drop {calls:,} calls", f"{took * 1000:.0f} ms", during))
                runs += [during, wrk(url, c, seconds, key)]
                table.append(("no drop", "", runs[-1]))
            requests = sum(r.requests for r in runs)
            # wrk's connections may have had a request in flight when each run ended.
            proxied = asyncio.run(logged(dsn, server_id))
            deadline = time.monotonic() + 30
            while proxied < requests and time.monotonic() < deadline:
                time.sleep(0.5)
                proxied = asyncio.run(logged(dsn, server_id))
            if not requests <= proxied <= requests + c * len(runs):
                raise RuntimeError(f"{requests} proxied requests but {proxied} calls logged")
            gone = {partitions.day_name(small), partitions.day_name(big)}
            expected = {k: v for k, v in before.items() if k not in gone}
            after = asyncio.run(day_counts(dsn, server_id))
            if after != expected:
                raise RuntimeError(f"calls were lost: {expected} before, {after} after")
        migration: tuple[float, float] | None = None
        if args.migration:
            asyncio.run(recreate_database(args.admin_dsn))
            migration = asyncio.run(
                time_migration(dsn, args.rows, (small_calls, big_calls), args.seed)
            )
    finally:
        if not args.keep:
            asyncio.run(recreate_database(args.admin_dsn, drop_only=True))
    print(f"\nproxy tools/call, wrk c={args.connections}, {args.seconds} s runs, "
          f"{args.rows:,} calls stored; every proxied call logged ({proxied:,})")  # fmt: skip
    print(f"{'run':24} {'drop took':>10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
    for label, took_text, r in table:
        print(
            f"{label:24} {took_text:>10} {r.rps:8.0f} {r.p50_ms:8.2f} {r.p99_ms:8.2f} {r.errors:7d}"
        )

    for line in steps.lines:
        if line.startswith("dropped"):
            print(f"  {line}")
    if migration is not None:
        print(
            f"\nmigration 5 on {args.rows:,} calls: {migration[0]:.1f} s (tool_calls locked), "
            f"then the partitions of the days kept: {migration[1] * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
