"""CORS for the MCP routes (the proxy's and the toolsets'), so browser MCP clients can use them:
any origin may call them.

That opens nothing: the gateway authenticates by header only (X-API-Key or a bearer token),
never by cookie. No other route answers a cross-origin request.
"""

from __future__ import annotations

from aiohttp import web

# Where the MCP routes live (PROXY_PATH and TOOLSET_PATH under the API prefix).
PROXY_PATHS = "/api/v1/proxy/"
TOOLSET_PATHS = "/api/v1/toolsets/"

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
    """An error's headers, with the CORS ones when it answers a browser on an MCP route."""
    if "Origin" in request.headers and _is_mcp(request.path):
        return {**(headers or {}), **ANSWER_HEADERS}
    return headers


def _is_mcp(path: str) -> bool:
    return path.startswith(PROXY_PATHS) or (
        path.startswith(TOOLSET_PATHS) and path.endswith("/mcp")
    )


def preflight(request: web.Request) -> web.Response:
    """The answer to a CORS preflight of an MCP route (browsers send it without credentials)."""
    requested = request.headers.get("Access-Control-Request-Headers")
    return web.Response(
        status=204,
        headers={
            **ANSWER_HEADERS,
            "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
            # Echoed, so the caller's Mcp-Param-* headers are allowed too.
            "Access-Control-Allow-Headers": requested or ALLOW_HEADERS,
            "Access-Control-Max-Age": "86400",
        },
    )
