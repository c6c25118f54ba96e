"""The gateway's own MCP client (streamable HTTP) and the upstream health probe."""

from gateway.mcp.client import (
    McpClient,
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
