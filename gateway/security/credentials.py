"""Turning a server's stored credentials into the headers sent upstream, and which header names
a credential may not use."""

from __future__ import annotations

import base64
import logging
from typing import Any

from gateway.mcp.headers import MANAGED_HEADERS

log = logging.getLogger(__name__)

# auth_type -> the fields its credentials object must have.
CREDENTIAL_FIELDS: dict[str, tuple[str, ...]] = {
    "bearer": ("token",),
    "api_key": ("header_name", "header_value"),
    "basic": ("username", "password"),
}

# Header names an api_key credential may not use, lower case. A stored header is added to every
# request the gateway sends upstream, so it must not change how HTTP frames or routes that
# request (hop-by-hop, Host, Content-*, Expect), pose as a proxy or the client's address
# (Forwarded, X-Forwarded-*, Via, ...), carry a browser's state (Cookie, Origin), or replace what
# the gateway itself sets (Accept, the MCP headers, the trace context).
REFUSED_HEADER_NAMES = frozenset(
    {
        # hop-by-hop (RFC 9110 7.6.1, and HTTP/1.1's upgrade to HTTP/2)
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "http2-settings",
        # framing and routing of the request
        "host",
        "expect",
        # who is asking, as proxies and browsers say it
        "forwarded",
        "via",
        "x-real-ip",
        "origin",
        "cookie",
        "set-cookie",
        # the trace context, set by the proxy and the gateway's spans
        "traceparent",
        "tracestate",
        "baggage",
    }
    # and what the gateway's MCP client sets itself (Accept, Host, the MCP headers, ...)
    | MANAGED_HEADERS
)
# ... and every name that starts with one of these: Content-Length/-Type/-Encoding/...,
# Proxy-Authorization/-Authenticate/-Connection, X-Forwarded-For/-Host/-Proto/..., and the MCP
# headers (Mcp-Session-Id, MCP-Protocol-Version, Mcp-Method, Mcp-Name, Mcp-Param-*).
REFUSED_HEADER_PREFIXES = ("content-", "proxy-", "x-forwarded-", "mcp-")


def refused_header_name(name: str) -> bool:
    """Whether a credential may not be sent under this header name (any letter case)."""
    lower = name.lower()
    return lower in REFUSED_HEADER_NAMES or lower.startswith(REFUSED_HEADER_PREFIXES)


def upstream_auth_headers(
    auth_type: str | None, credentials: dict[str, Any] | None
) -> dict[str, str]:
    if auth_type is None or credentials is None:
        return {}
    if auth_type == "bearer":
        return {"Authorization": f"Bearer {credentials['token']}"}
    if auth_type == "api_key":
        name = credentials["header_name"]
        if refused_header_name(name):
            # Stored before the API refused such names: sent as nothing rather than as a header
            # that would change how the request is framed or routed.
            log.warning("not sending a stored credential under the refused header name %s", name)
            return {}
        return {name: credentials["header_value"]}
    if auth_type == "basic":
        pair = f"{credentials['username']}:{credentials['password']}".encode()
        return {"Authorization": f"Basic {base64.b64encode(pair).decode()}"}
    raise ValueError(f"unknown auth_type {auth_type!r}")
