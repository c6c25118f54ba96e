"""What tracing costs the proxy: the gateway with tracing off against the gateway exporting
every span (100 % sampling) to a collector on loopback.

    python bench/tracing.py [--seconds 5] [--runs 3] [--connections 1,64] [--ratio 0.1]

One command: a private PostgreSQL, bench/proxy.py's MCP upstream, a sink collector (POST
/v1/traces answered 200, the body read and thrown away) and two gateways, one without an OTLP
endpoint and one with OTEL_EXPORTER_OTLP_ENDPOINT set to the sink. Both gateways run on CPU 0
(one at a time: wrk drives them alternately), upstream, sink and wrk on CPU 1. Prints req/s and
p50 per concurrency (median of the runs), the traced gateway's throughput as a share of the
untraced one and its p50 over it (paired runs), and the traced gateway's span counts from
/metrics (exported, dropped: the exporter thread shares the gateway's CPU). Everything runs on
127.0.0.1 and is stopped by PID at the end. `--ratio` samples that share of the traces
(OTEL_TRACES_SAMPLER=traceidratio) instead of all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    OTHERS_CPU,
    WrkResult,
    free_port,
    gateway,
    mcp_upstream,
    median_result,
    pinned,
    postgres,
    process,
    wrk,
)


def serve_sink(port: int) -> None:
    """An OTLP/HTTP collector that takes every export and keeps nothing."""
    from aiohttp import web

    async def traces(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/traces", traces)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def span_counts(url: str) -> dict[str, float]:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"{url}/api/v1/metrics") as response:
        text = await response.text()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("mcp_gateway_trace_spans_total{"):
            result = line.split('result="')[1].split('"')[0]
            counts[result] = counts.get(result, 0) + float(line.rsplit(" ", 1)[1])
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=5, help="per wrk run")
    parser.add_argument("--runs", type=int, default=3, help="runs per gateway and concurrency")
    parser.add_argument("--connections", default="1,64")
    parser.add_argument("--ratio", type=float, help="sample this share of traces (default: all)")
    parser.add_argument("--sink", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sink:
        serve_sink(args.sink)
        return
    connections = [int(c) for c in args.connections.split(",")]
    sink_port = free_port()
    traced_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}",
        "OTEL_TRACES_SAMPLER": "always_on",
    }
    if args.ratio is not None:
        traced_env |= {
            "OTEL_TRACES_SAMPLER": "traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(args.ratio),
        }
    with (
        postgres() as dsn,
        mcp_upstream() as upstream_url,
        process(
            pinned(OTHERS_CPU, [sys.executable, __file__, "--sink", str(sink_port)]), sink_port
        ),
        gateway(dsn) as plain,
        gateway(dsn, traced_env) as traced,
    ):
        targets = {}
        for name, gw in (("off", plain), ("on", traced)):
            server_id = asyncio.run(gw.add_server(upstream_url))
            targets[name] = (f"{gw.url}/api/v1/proxy/{server_id}/mcp", gw.key)
        for url, key in targets.values():
            wrk(url, 16, 2, key)
        results: dict[int, dict[str, dict[str, float]]] = {}
        paired: dict[int, tuple[float, float]] = {}
        for c in connections:
            runs: dict[str, list[WrkResult]] = {name: [] for name in targets}
            for _ in range(args.runs):
                for name, (url, key) in targets.items():
                    runs[name].append(wrk(url, c, args.seconds, key))
                    print(f"tracing {name:3} c={c:<3} {runs[name][-1]}", file=sys.stderr)
            results[c] = {name: median_result(of) for name, of in runs.items()}
            pairs = list(zip(runs["off"], runs["on"], strict=True))
            paired[c] = (
                statistics.median(on.rps / off.rps for off, on in pairs),
                statistics.median(on.p50_ms - off.p50_ms for off, on in pairs),
            )
        counts = asyncio.run(span_counts(traced.url))
    print(f"\n{'tracing':8} {'c':>3} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for c in connections:
        for name in targets:
            r = results[c][name]
            print(f"{name:8} {c:>3} {r['rps']:>9.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}")
    print()
    for c in connections:
        share, p50 = paired[c]
        print(f"c={c:<3} traced / untraced throughput {share:.2f}, p50 {p50:+.2f} ms")
    exported, dropped = counts.get("exported", 0), counts.get("dropped", 0)
    print(f"spans: exported {exported:.0f}, dropped {dropped:.0f}")


if __name__ == "__main__":
    main()
