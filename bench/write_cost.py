"""Where a call log batch's time goes: microseconds per row of the writer's statements.

    python bench/write_cost.py [--rounds 40] [--batch 5000]

Starts a private PostgreSQL (pgserver, in a temporary directory deleted at the end) and, on one
connection, times: the writer's whole batch (COPY + rollups, gateway.db.tool_calls.write_batch),
then COPY alone with every index of tool_calls, and COPY again after dropping the secondary
indexes one by one, then the primary key. The table grows as it goes (as in production), and
this process and PostgreSQL share CPU 1, so client-side encoding is included. Medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
from uuid_utils.compat import uuid7

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import OTHERS_CPU
from gateway.db import tool_calls
from gateway.db.schema import apply_schema

SECONDARY = (
    "tool_calls_caller_idx",
    "tool_calls_errors_idx",
    "tool_calls_tool_idx",
    "tool_calls_server_idx",
    "tool_calls_workspace_idx",
)


async def measure(dsn: str, rounds: int, size: int) -> None:
    conn = await asyncpg.connect(dsn)
    await apply_schema(conn)
    ws = await conn.fetchval("INSERT INTO workspaces (name, slug) VALUES ('w', 'w') RETURNING id")
    server = await conn.fetchval(
        "INSERT INTO servers (workspace_id, name, url) VALUES ($1, 's', 'http://x') RETURNING id",
        ws,
    )
    tools = ["search", "fetch", "summarise", "translate", "lookup"]

    def batch() -> list[tuple[Any, ...]]:
        now = datetime.now(UTC)
        return [
            (uuid7(), ws, server, tools[i % 5], "bench", "error" if i % 20 == 0 else "success",
             (i * 7) % 3000, 100, 250, 1024, None, now)
            for i in range(size)
        ]  # fmt: skip

    async def timed(label: str, write: Callable[[list[tuple[Any, ...]]], Awaitable[Any]]) -> None:
        times = []
        for _ in range(rounds):
            rows = batch()
            started = time.perf_counter()
            await write(rows)
            times.append(time.perf_counter() - started)
        print(f"{label:<48} {statistics.median(times) / size * 1e6:6.1f} µs/row")

    async def copy(rows: list[tuple[Any, ...]]) -> None:
        async with conn.transaction():
            await conn.copy_records_to_table("tool_calls", records=rows, columns=tool_calls.COLUMNS)

    async def write(rows: list[tuple[Any, ...]]) -> None:
        await tool_calls.write_batch(conn, rows, retry=False)

    await timed("(warm-up)", write)
    await timed("write_batch: COPY + rollups", write)
    await timed("COPY, every index", copy)
    for index in SECONDARY:
        await conn.execute(f"DROP INDEX {index}")
        await timed(f"COPY, also without {index}", copy)
    await conn.execute("ALTER TABLE tool_calls DROP CONSTRAINT tool_calls_pkey")
    await timed("COPY, no index at all", copy)
    await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--batch", type=int, default=5000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(OTHERS_CPU)})  # PostgreSQL, started from here, inherits it
    import pgserver

    with tempfile.TemporaryDirectory(prefix="mcpg-write-cost-") as data:
        server = pgserver.get_server(data, cleanup_mode="delete")
        try:
            asyncio.run(measure(server.get_uri(), args.rounds, args.batch))
        finally:
            server.cleanup()


if __name__ == "__main__":
    main()
