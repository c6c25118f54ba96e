"""What MCP clients look for before they connect: OAuth metadata, which this gateway has not.

An MCP client refused with a 401 starts OAuth discovery (MCP authorization spec): it asks
/.well-known/oauth-protected-resource (plus the MCP URL's path), then
/.well-known/oauth-authorization-server or openid-configuration, then registers at /register.
These paths are outside /api/, so they would get the dashboard's HTML "not found" page, which
clients then print as a registration error. They get a JSON 404 that says what to do instead.
"""

from __future__ import annotations

from aiohttp import web

from gateway.errors import json_error
from gateway.proxy import cors

# One line, as clients print it: what the gateway takes instead of OAuth.
NO_OAUTH = (
    "this gateway does not offer OAuth: it takes API keys. Send yours as "
    "'Authorization: Bearer mcpg_…' or 'X-API-Key: mcpg_…' (create one under Settings, "
    "API keys, in the dashboard)"
)

# RFC 8414 and RFC 9728 metadata, at the root or followed by the resource's path, and OpenID
# discovery, which SDK clients try after them; then dynamic client registration (RFC 7591) and
# the token endpoint, which clients assume at the root when metadata is missing. /authorize is
# opened in a browser, where the dashboard's page says "not found" well enough.
_PATHS = (
    "/.well-known/{name:oauth-[^/]*}{rest:(/.*)?}",
    "/.well-known/openid-configuration{rest:(/.*)?}",
    "/register",
    "/token",
)


async def _no_oauth(request: web.Request) -> web.Response:
    # Browser clients (the Inspector's web UI) read the answer too, after a preflight when
    # they send MCP headers.
    if request.method == "OPTIONS":
        return web.Response(
            status=204,
            headers={
                **cors.ANSWER_HEADERS,
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": cors.ALLOW_HEADERS,
            },
        )
    headers = dict(cors.ANSWER_HEADERS) if "Origin" in request.headers else None
    return json_error(404, NO_OAUTH, headers)


def setup_discovery(app: web.Application) -> None:
    for path in _PATHS:
        app.router.add_route("*", path, _no_oauth)
