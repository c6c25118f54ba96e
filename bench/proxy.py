"""Proxy overhead: straight to the upstream vs two bare aiohttp pass-throughs vs the gateway.

    python bench/proxy.py [--seconds 5] [--runs 3] [--connections 1,16,64]

One command: starts a private PostgreSQL, a cheap stateless-JSON MCP upstream (aiohttp), two
bare pass-throughs (no auth, no logging: ceilings for Python) and the gateway (API key, every
call logged), then drives each with wrk posting tools/call with distinct ids. The two ceilings:

- "passthrough" answers from a buffered read of the reply (the old, flattering ceiling);
- "relay", the fair one: it reads each request's JSON-RPC and relays the reply as it arrives,
  as a streaming proxy must (a StreamResponse fed from iter_any).

The gateway and the pass-throughs run on CPU 0; upstream, wrk and PostgreSQL on CPU 1 (taskset).
Prints req/s and p50/p99 per concurrency (median of the runs), the ratios against both
ceilings, and checks that the gateway logged every request. Everything runs on 127.0.0.1 and is
stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    GATEWAY_CPU,
    OTHERS_CPU,
    WrkResult,
    free_port,
    gateway,
    median_result,
    pinned,
    postgres,
    process,
    wrk,
)


def serve_upstream(port: int) -> None:
    """A cheap MCP upstream: answers every JSON-RPC request with a small result, as JSON."""
    import orjson
    import uvloop
    from aiohttp import web

    async def mcp(request: web.Request) -> web.Response:
        message = orjson.loads(await request.read())
        if "id" not in message:
            return web.Response(status=202)  # a notification
        result: dict[str, object] = {
            "content": [{"type": "text", "text": "hello"}],
            "isError": False,
        }
        if message.get("method") == "initialize":  # a 2025-era server without sessions
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "bench-upstream", "version": "1"}}  # fmt: skip
        elif message.get("method") == "tools/list":
            result = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
        elif message.get("method") != "tools/call":
            error = {"code": -32601, "message": "Method not found"}
            body = orjson.dumps({"jsonrpc": "2.0", "id": message.get("id"), "error": error})
            return web.Response(body=body, content_type="application/json")
        body = orjson.dumps({"jsonrpc": "2.0", "id": message.get("id"), "result": result})
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/mcp", mcp)
    web.run_app(
        app, host="127.0.0.1", port=port, access_log=None, print=None, loop=uvloop.new_event_loop()
    )


def serve_passthrough(port: int, upstream: str, relay: bool) -> None:
    """A ceiling: forward body and answer with one shared ClientSession, nothing else. With
    `relay`, the fair one: the request's JSON-RPC is read and the reply streamed back."""
    import aiohttp
    import orjson
    import uvloop
    from aiohttp import web

    async def session(app: web.Application):  # type: ignore[no-untyped-def]
        app["http"] = aiohttp.ClientSession(auto_decompress=False)
        yield
        await app["http"].close()

    async def mcp(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {"Content-Type": "application/json", "Accept": request.headers["Accept"]}
        async with request.app["http"].post(upstream, data=body, headers=headers) as reply:
            return web.Response(
                body=await reply.read(), status=reply.status, content_type=reply.content_type
            )

    async def mcp_relayed(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        orjson.loads(body)  # what any MCP-aware proxy does with each request
        headers = {"Content-Type": "application/json", "Accept": request.headers["Accept"]}
        async with request.app["http"].post(upstream, data=body, headers=headers) as reply:
            response = web.StreamResponse(
                status=reply.status, headers={"Content-Type": reply.headers["Content-Type"]}
            )
            if reply.content_length is not None:
                response.content_length = reply.content_length
            await response.prepare(request)
            async for chunk in reply.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.cleanup_ctx.append(session)
    app.router.add_post("/mcp", mcp_relayed if relay else mcp)
    web.run_app(
        app, host="127.0.0.1", port=port, access_log=None, print=None, loop=uvloop.new_event_loop()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=5, help="per wrk run")
    parser.add_argument("--runs", type=int, default=3, help="runs per target and concurrency")
    parser.add_argument("--connections", default="1,16,64")
    parser.add_argument(
        "--role", choices=["upstream", "passthrough", "relay"], help=argparse.SUPPRESS
    )
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "upstream":
        serve_upstream(args.port)
        return
    if args.role in ("passthrough", "relay"):
        serve_passthrough(args.port, args.upstream, relay=args.role == "relay")
        return
    connections = [int(c) for c in args.connections.split(",")]
    me = [sys.executable, __file__]
    upstream_port, pass_port, relay_port = free_port(), free_port(), free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    results: dict[str, dict[int, dict[str, float]]] = {}
    ratios: dict[int, dict[str, float]] = {}
    with (
        postgres() as dsn,
        process(
            pinned(OTHERS_CPU, [*me, "--role", "upstream", "--port", str(upstream_port)]),
            upstream_port,
        ),
        process(
            pinned(
                GATEWAY_CPU,
                [
                    *me,
                    "--role",
                    "passthrough",
                    "--port",
                    str(pass_port),
                    "--upstream",
                    upstream_url,
                ],
            ),
            pass_port,
        ),
        process(
            pinned(
                GATEWAY_CPU,
                [*me, "--role", "relay", "--port", str(relay_port), "--upstream", upstream_url],
            ),
            relay_port,
        ),
        gateway(dsn) as gw,
    ):
        server_id = asyncio.run(gw.add_server(upstream_url))
        targets = {
            "straight": (upstream_url, ""),
            "passthrough": (f"http://127.0.0.1:{pass_port}/mcp", ""),
            "relay": (f"http://127.0.0.1:{relay_port}/mcp", ""),
            "gateway": (f"{gw.url}/api/v1/proxy/{server_id}/mcp", gw.key),
        }
        for url, key in targets.values():  # warm up connections, caches, JIT-free but still
            wrk(url, 16, 2, key)
        time.sleep(1)  # the warm-up's last calls: still in flight or queued for the log
        logged_before = asyncio.run(gw.count_calls())
        gateway_requests = 0
        for c in connections:
            # Interleaved (straight, pass-through, gateway, straight, ...) rather than all runs
            # of one target then the next: this VM's speed drifts by tens of percent within
            # minutes, and the ratios compare runs made seconds apart.
            runs: dict[str, list[WrkResult]] = {name: [] for name in targets}
            for _ in range(args.runs):
                for name, (url, key) in targets.items():
                    runs[name].append(wrk(url, c, args.seconds, key))
                    print(f"{name:12} c={c:<3} {runs[name][-1]}", file=sys.stderr)
            for name, of_target in runs.items():
                results.setdefault(name, {})[c] = median_result(of_target)
            gateway_requests += sum(r.requests for r in runs["gateway"])
            ratios[c] = paired_ratios(runs)
        # Every request wrk counted must be in the log (in-flight ones at the end of a run may
        # add a few more: wrk does not count responses after its deadline).
        expected_max = gateway_requests + sum(connections) * args.runs
        deadline = time.monotonic() + 30
        logged = 0
        while time.monotonic() < deadline:
            logged = asyncio.run(gw.count_calls()) - logged_before
            if logged >= gateway_requests:
                break
            time.sleep(0.5)
    report(results, ratios, connections)
    print(f"\ngateway requests answered: {gateway_requests}, tool calls logged: {logged}")
    ok = gateway_requests <= logged <= expected_max
    print("log check:", "OK, nothing dropped" if ok else "MISMATCH")
    if not ok:
        raise SystemExit(1)


def paired_ratios(runs: dict[str, list[WrkResult]]) -> dict[str, float]:
    """Medians over the runs of the gateway against the other targets' runs beside it."""
    runs_ = list(
        zip(runs["straight"], runs["passthrough"], runs["relay"], runs["gateway"], strict=True)
    )
    return {
        "vs_relay": statistics.median(g.rps / r.rps for _, _, r, g in runs_),
        "vs_passthrough": statistics.median(g.rps / p.rps for _, p, _, g in runs_),
        "vs_straight": statistics.median(g.rps / s.rps for s, _, _, g in runs_),
        "p50_over_straight": statistics.median(g.p50_ms - s.p50_ms for s, _, _, g in runs_),
        "p50_over_relay": statistics.median(g.p50_ms - r.p50_ms for _, _, r, g in runs_),
    }


def report(
    results: dict[str, dict[int, dict[str, float]]],
    ratios: dict[int, dict[str, float]],
    connections: list[int],
) -> None:
    print(f"\n{'target':12} {'c':>3} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for name, by_c in results.items():
        for c in connections:
            r = by_c[c]
            print(
                f"{name:12} {c:>3} {r['rps']:>9.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
                f"{r['errors']:>6.0f}"
            )
    print("\nmedians of the ratios of runs made side by side:")
    for c in connections:
        r = ratios[c]
        print(
            f"c={c:<3} gateway/relay (fair) req/s = {r['vs_relay']:.2f}, "
            f"gateway/passthrough (buffered) = {r['vs_passthrough']:.2f}, "
            f"gateway/straight = {r['vs_straight']:.2f}, "
            f"p50 added over straight = {r['p50_over_straight']:+.2f} ms, "
            f"over relay = {r['p50_over_relay']:+.2f} ms"
        )


if __name__ == "__main__":
    main()
