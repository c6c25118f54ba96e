"""How long one probe round takes: N registered servers, one gateway, a cheap loopback upstream.

    python bench/probe_round.py [--servers 500] [--concurrency 50] [--rounds 3] [--modern]

Everything runs on 127.0.0.1 and is stopped at the end: a throwaway database (in DATABASE_URL's
server if set, else an embedded PostgreSQL in a temp dir), a minimal MCP upstream in a child
process (so its CPU does not count as the gateway's), and the gateway app with its workers off.
One round is what the background prober does each interval: claim the due servers (FOR UPDATE
SKIP LOCKED), probe them at most `--concurrency` at once, store each check (one statement that
also updates the server row, the hourly rollup and the counters).

The upstream is stateless and handshake-era by default (server/discover refused, initialize,
notifications/initialized, tools/list: four requests a probe); `--modern` makes it answer
server/discover (two requests a probe).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import secrets
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg
import orjson
import uvloop
from aiohttp import web
from cryptography.fernet import Fernet

from gateway.app import create_app
from gateway.background.prober import Prober
from gateway.config import Settings
from gateway.db import servers as servers_db
from gateway.keys import POOL

TOOLS = [
    {
        "name": f"tool_{i}",
        "description": f"benchmark tool {i}",
        "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}},
    }
    for i in range(10)
]
_TIMEOUT_SECONDS = 300


# -- the upstream (child process) ----------------------------------------------------------------


def _serve_upstream(sock: socket.socket, modern: bool) -> None:
    async def handle(request: web.Request) -> web.Response:
        if request.method != "POST":
            return web.Response(status=405, headers={"Allow": "POST"})
        body = orjson.loads(await request.read())
        rid, method = body.get("id"), body.get("method")
        if rid is None:
            return web.Response(status=202)
        if method == "server/discover" and modern:
            result: dict[str, Any] = {"supportedVersions": ["2026-07-28"], "capabilities": {}}
        elif method == "initialize":
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bench-upstream", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": TOOLS}
        else:
            error = {"code": -32601, "message": "Method not found"}
            return _json({"jsonrpc": "2.0", "id": rid, "error": error})
        return _json({"jsonrpc": "2.0", "id": rid, "result": result})

    app = web.Application()
    app.router.add_route("*", "/mcp", handle)
    web.run_app(app, sock=sock, print=None, access_log=None, loop=uvloop.new_event_loop())


def _json(message: dict[str, Any]) -> web.Response:
    return web.Response(body=orjson.dumps(message), content_type="application/json")


# -- the database ----------------------------------------------------------------------------------


def _with_database(dsn: str, name: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


async def _register(pool: asyncpg.Pool, count: int, url: str) -> None:
    async with pool.acquire() as conn:
        workspace_id = await conn.fetchval(
            "INSERT INTO workspaces (name, slug) VALUES ('bench', $1) RETURNING id",
            f"bench-{secrets.token_hex(4)}",
        )
        for i in range(count):
            # Distinct URLs, as real servers would have (the path's query string is ignored).
            await servers_db.create(
                conn,
                workspace_id,
                name=f"server-{i:04d}",
                url=f"{url}?server={i}",
                description="",
                tags=[],
                auth_type=None,
                credentials=None,
                limit=count,  # the benchmark's own servers, past the default bound
            )


# -- the run ---------------------------------------------------------------------------------------


async def bench(admin_dsn: str, args: argparse.Namespace, upstream_url: str) -> None:
    name = f"probe_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f"CREATE DATABASE {name}")
    try:
        settings = Settings(
            database_url=_with_database(admin_dsn, name),
            jwt_secret=secrets.token_urlsafe(48),
            secret_keys=(Fernet.generate_key().decode(),),
            probe_concurrency=args.concurrency,
            # The servers share one workspace here: its share is the whole concurrency, so a
            # round measures the prober's throughput rather than the fairness bound.
            probes_per_workspace=args.concurrency,
            run_workers=False,
        )
        runner = web.AppRunner(create_app(settings))
        await runner.setup()  # the pool, the HTTP client, the schema; no listening socket
        try:
            app = runner.app
            pool = app[POOL]
            await _register(pool, args.servers, upstream_url)
            prober = Prober.from_app(app)
            print(
                f"{args.servers} servers, concurrency {args.concurrency}, "
                f"{'modern (server/discover)' if args.modern else 'handshake'} upstream, "
                f"{os.cpu_count()} CPUs"
            )
            for round_no in range(1, args.rounds + 1):
                since = await pool.fetchval(
                    "UPDATE servers SET next_probe_at = now() RETURNING now()"
                )
                started = time.perf_counter()
                probed = await prober.run_round()
                elapsed = time.perf_counter() - started
                rows = await pool.fetch(
                    "SELECT status, latency_ms FROM health_checks WHERE checked_at > $1", since
                )
                latencies = sorted(r["latency_ms"] for r in rows)
                statuses: dict[str, int] = {}
                for r in rows:
                    statuses[r["status"]] = statuses.get(r["status"], 0) + 1
                q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
                print(
                    f"round {round_no}: {probed} probes in {elapsed:.2f} s "
                    f"({probed / elapsed:.0f} probes/s); probe latency ms "
                    f"p50 {q[49]:.1f} p95 {q[94]:.1f} max {latencies[-1]:.1f}; {statuses}"
                )
            total = await pool.fetchval("SELECT count(*) FROM health_checks")
            print(f"{total} checks stored")
        finally:
            await runner.cleanup()
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modern", action="store_true", help="upstream answers server/discover")
    args = parser.parse_args()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    upstream_url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    upstream = multiprocessing.get_context("spawn").Process(
        target=_serve_upstream, args=(sock, args.modern), daemon=True
    )
    upstream.start()
    sock.close()
    pg_dir = None
    try:
        admin_dsn = os.environ.get("DATABASE_URL")
        if admin_dsn is None:
            import pgserver

            pg_dir = tempfile.TemporaryDirectory(prefix="probe-bench-")
            server = pgserver.get_server(Path(pg_dir.name), cleanup_mode="delete")
            admin_dsn = server.get_uri()

        async def run() -> None:
            async with asyncio.timeout(_TIMEOUT_SECONDS):
                await bench(admin_dsn, args, upstream_url)

        uvloop.run(run())
    finally:
        upstream.terminate()
        upstream.join(5)
        if upstream.is_alive():
            upstream.kill()
        if pg_dir is not None:
            server.cleanup()
            pg_dir.cleanup()


if __name__ == "__main__":
    main()
