"""The gateway's own MCP client: streamable HTTP in both protocol eras (client), what goes
wrong talking to an upstream (errors), the 2026-07-28 header encoding (headers), the bounds on
tool lists and the memory they may take (tool_list_budget), SSE parsing (sse), and the
upstream health probe (probe). It knows nothing of the app."""

from gateway.mcp.client import McpClient
from gateway.mcp.errors import (
    McpConnectionError,
    McpError,
    McpHttpError,
    McpResponseError,
    McpRpcError,
    McpTimeoutError,
    UnsupportedTransport,
)
from gateway.mcp.probe import DEGRADED, DOWN, HEALTHY, ProbeResult, probe, tools_hash

__all__ = [
    "DEGRADED",
    "DOWN",
    "HEALTHY",
    "McpClient",
    "McpConnectionError",
    "McpError",
    "McpHttpError",
    "McpResponseError",
    "McpRpcError",
    "McpTimeoutError",
    "ProbeResult",
    "UnsupportedTransport",
    "probe",
    "tools_hash",
]
