"""What goes wrong talking to an upstream, as exceptions whose `str()` is written for a
person (the API's 502 details, a probe's reason, a call log row's error message)."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit


class McpError(Exception):
    """Base of every failure talking to an upstream; `str()` is written for a person."""


class McpConnectionError(McpError):
    """The upstream could not be reached or dropped the connection."""


class McpTimeoutError(McpError):
    """The upstream did not answer in time."""


class McpHttpError(McpError):
    """The upstream answered with a non-2xx HTTP status outside JSON-RPC."""

    def __init__(self, status: int, reason: str | None, detail: str | None = None) -> None:
        self.status = status
        self.reason = reason or reason_phrase(status)
        self.detail = detail
        text = f"HTTP {status} {self.reason}".rstrip()
        super().__init__(f"{text}: {detail}" if detail else text)


class McpRpcError(McpError):
    """The upstream answered the request with a JSON-RPC error object."""

    def __init__(self, code: int, message: str, data: Any = None, http_status: int = 200) -> None:
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status
        super().__init__(f"JSON-RPC error {code}: {message}")


class McpResponseError(McpError):
    """The upstream's answer is not a valid MCP response."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"invalid response: {problem}")


class UnsupportedTransport(McpError):
    """The upstream speaks the legacy HTTP+SSE transport (2024-11-05), which cannot be proxied."""

    def __init__(self) -> None:
        super().__init__(
            "unsupported transport: the server speaks the legacy HTTP+SSE transport (2024-11-05); "
            "the gateway needs a streamable HTTP endpoint"
        )


class ToolListTooLarge(McpError):
    """The upstream's tool list is over a bound: its bytes, its tools, or its parsed size."""


def error_kind(exc: McpError) -> str:
    """A short, low-cardinality name for a failure (a span's error.type): `timeout`,
    `unreachable`, the HTTP status, the JSON-RPC error code, or the kind of bad answer."""
    if isinstance(exc, McpHttpError):
        return str(exc.status)
    if isinstance(exc, McpRpcError):
        return str(exc.code)
    return _KINDS.get(type(exc), "mcp_error")


def reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def host_of(url: str) -> str:
    """The host (and port) of an upstream URL, as errors and the log may name it: without user
    info, path or query, any of which may carry a token."""
    return urlsplit(url).netloc.rpartition("@")[2] or "the upstream"


_KINDS: dict[type[McpError], str] = {
    McpConnectionError: "unreachable",
    McpTimeoutError: "timeout",
    McpResponseError: "bad_response",
    UnsupportedTransport: "unsupported_transport",
    ToolListTooLarge: "tool_list_too_large",
}
