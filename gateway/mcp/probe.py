"""Health probe of one upstream MCP server: connect, list tools, classify the outcome."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import orjson

from gateway.mcp.client import McpClient
from gateway.mcp.errors import McpError, McpRpcError, ToolListTooLarge, error_kind, host_of
from gateway.mcp.tool_list_budget import ToolListMemory

log = logging.getLogger(__name__)

HEALTHY: Final = "healthy"
DEGRADED: Final = "degraded"
DOWN: Final = "down"


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """Outcome of one probe; `tool_count` and `tools_hash` are set only if tools/list worked."""

    status: str
    latency_ms: float
    error: str | None
    tool_count: int | None
    tools_hash: str | None
    # The tools listed, for their fingerprints (gateway/upstreams/fingerprints).
    tools: list[dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    # What kind of failure made it `down` or `degraded` (error_kind's names, `slow`, `crash`).
    failure: str | None = field(default=None, compare=False)


def tools_hash(tools: Sequence[Mapping[str, Any]]) -> str:
    """sha256 hex of a tool list: the order of tools and keys does not matter, content does."""
    canonical = [orjson.dumps(tool, option=orjson.OPT_SORT_KEYS) for tool in tools]
    ordered = sorted(
        zip(tools, canonical, strict=True), key=lambda pair: (str(pair[0].get("name", "")), pair[1])
    )
    return hashlib.sha256(b"[" + b",".join(raw for _, raw in ordered) + b"]").hexdigest()


async def probe(
    http: aiohttp.ClientSession,
    url: str,
    headers: Mapping[str, str],
    *,
    timeout: float,  # noqa: ASYNC109 -- a bound on the whole probe, part of its contract
    degraded_ms: float,
    memory: ToolListMemory | None = None,
    owner: Hashable = None,
) -> ProbeResult:
    """Connect (server/discover or the handshake) and list tools, all within `timeout` seconds.

    Never raises for upstream problems: they become a `down` or `degraded` result. The tool
    list is read within `memory` (the process's) for `owner` (the server's workspace); a list
    over its bounds (see McpClient.list_tools) is `degraded`: the server answers, but not with
    a list the gateway will read.
    """
    started = time.perf_counter()

    def elapsed_ms() -> float:
        return round((time.perf_counter() - started) * 1000, 3)

    client = McpClient(http, url, headers, timeout, memory=memory, owner=owner)
    try:
        try:
            async with asyncio.timeout(timeout):
                await client.connect()
                tools = await client.list_tools()
        except (McpRpcError, ToolListTooLarge) as exc:
            # It answered in JSON-RPC, so it is up, but it cannot serve what we asked.
            kind = error_kind(exc)
            result = ProbeResult(DEGRADED, elapsed_ms(), str(exc), None, None, failure=kind)
        except McpError as exc:
            result = ProbeResult(DOWN, elapsed_ms(), str(exc), None, None, failure=error_kind(exc))
        except TimeoutError:
            slow = f"timed out after {timeout:g} s"
            result = ProbeResult(DOWN, elapsed_ms(), slow, None, None, failure="timeout")
        except Exception as exc:
            # A bug of ours, not the upstream's; record it rather than lose the check.
            log.exception("probe of %s crashed", host_of(url))
            result = ProbeResult(
                DOWN, elapsed_ms(), f"probe failed: {type(exc).__name__}", None, None, None, "crash"
            )
        else:
            latency = elapsed_ms()
            if latency <= degraded_ms:
                result = ProbeResult(HEALTHY, latency, None, len(tools), tools_hash(tools), tools)
            else:
                slow = f"answered in {latency:.0f} ms, over the {degraded_ms:g} ms threshold"
                result = ProbeResult(
                    DEGRADED, latency, slow, len(tools), tools_hash(tools), tools, "slow"
                )
    finally:
        # Outside the measured, time-bounded part: ending the session is not part of its health.
        await client.close()
    log.debug(
        "probe %s: %s in %.0f ms",
        host_of(url),
        result.status,
        result.latency_ms,
        extra={
            "upstream": host_of(url),
            "probe_status": result.status,
            "latency_ms": result.latency_ms,
        },
    )
    return result
