"""CORS for the proxy's routes, so browser MCP clients can use it: any origin may call them.

That opens nothing: the gateway authenticates by header only (X-API-Key or a bearer token),
never by cookie. No other route answers a cross-origin request.
"""

from __future__ import annotations

from aiohttp import web

# Where the proxy's routes live (gateway/proxy.py's PROXY_PATH under the API prefix).
PROXY_PATHS = "/api/v1/proxy/"

ALLOW_HEADERS = (
    "Authorization, X-API-Key, Content-Type, Accept, Mcp-Session-Id, MCP-Protocol-Version, "
    "Mcp-Method, Mcp-Name, Last-Event-ID, X-Caller-Agent, traceparent, tracestate"
)
# On every answer of a proxy route to a request with an Origin, errors included.
ANSWER_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Expose-Headers": "Mcp-Session-Id, Retry-After, Allow, WWW-Authenticate",
}


def error_headers(request: web.Request, headers: dict[str, str] | None) -> dict[str, str] | None:
    """An error's headers, with the CORS ones when it answers a browser on a proxy route."""
    if "Origin" in request.headers and request.path.startswith(PROXY_PATHS):
        return {**(headers or {}), **ANSWER_HEADERS}
    return headers
