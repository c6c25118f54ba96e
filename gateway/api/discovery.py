"""What MCP clients look for before they connect: the OAuth metadata documents.

An MCP client refused with a 401 starts OAuth discovery (MCP authorization spec): it reads the
protected resource metadata of the MCP URL (RFC 9728, /.well-known/oauth-protected-resource
plus the URL's path), then the authorization server's (RFC 8414,
/.well-known/oauth-authorization-server), then registers or presents its metadata document.
Both documents are public and answer any origin (browser clients such as the Inspector read
them). A resource document is answered for any well-formed MCP URL: whether its server or
toolset exists is only checked for a member, at consent.

Anything else under /.well-known/oauth-*, and OpenID discovery, which this gateway does not
offer, is a JSON 404 saying what to use instead, as are /register and /token at the root
(where clients guess when there is no metadata): a client prints it rather than an HTML page.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from aiohttp import web

from gateway.config import Settings
from gateway.errors import json_error
from gateway.keys import SETTINGS
from gateway.oauth import oauth_refusal
from gateway.oauth.resources import METADATA_PREFIX, protected_resource_metadata
from gateway.oauth.server import server_metadata
from gateway.proxy import cors

# What the gateway takes when OAuth is off, as clients print it.
API_KEYS = (
    "send an API key as 'Authorization: Bearer mcpg_…' or 'X-API-Key: mcpg_…' (create one "
    "under Settings, API keys, in the dashboard)"
)
AUTHORIZATION_SERVER_PATH = "/.well-known/oauth-authorization-server"
_RESOURCE_PATHS = (
    METADATA_PREFIX + "/api/v1/proxy/{id}/mcp",
    METADATA_PREFIX + "/api/v1/toolsets/{id}/mcp",
)
_DOCUMENTS = re.compile(
    re.escape(AUTHORIZATION_SERVER_PATH)
    + "|"
    + re.escape(METADATA_PREFIX)
    + "/api/v1/(proxy|toolsets)/[^/]+/mcp"
)
# Every other place clients look: at the root or followed by a path.
_OTHER_PATHS = (
    "/.well-known/{name:oauth-[^/]*}{rest:(/.*)?}",
    "/.well-known/openid-configuration{rest:(/.*)?}",
    "/register",
    "/token",
)


def _document(request: web.Request, body: dict[str, Any]) -> web.Response:
    headers = {"Cache-Control": "public, max-age=300", **cors.ANSWER_HEADERS}
    return web.json_response(body, headers=headers)


def _not_here(request: web.Request, detail: str) -> web.Response:
    return json_error(404, detail, dict(cors.ANSWER_HEADERS))


def no_oauth(settings: Settings) -> str | None:
    """What a client reads when OAuth is off: why, and what the gateway takes instead."""
    refusal = oauth_refusal(settings)
    return None if refusal is None else f"{refusal}; meanwhile {API_KEYS}"


def _off(request: web.Request) -> web.Response | None:
    detail = no_oauth(request.app[SETTINGS])
    return None if detail is None else _not_here(request, detail)


async def _preflight(request: web.Request) -> web.Response:
    return web.Response(
        status=204,
        headers={
            **cors.ANSWER_HEADERS,
            "Access-Control-Allow-Methods": "GET, OPTIONS",
            "Access-Control-Allow-Headers": request.headers.get(
                "Access-Control-Request-Headers", cors.ALLOW_HEADERS
            ),
            "Access-Control-Max-Age": "86400",
        },
    )


async def authorization_server(request: web.Request) -> web.Response:
    off = _off(request)
    if off is not None:
        return off
    return _document(request, server_metadata(request.app[SETTINGS].base_url))


async def protected_resource(request: web.Request) -> web.Response:
    off = _off(request)
    if off is not None:
        return off
    try:
        uuid.UUID(request.match_info["id"])
    except ValueError:
        return _not_here(request, "no protected resource here: not an MCP URL of this gateway")
    path = request.path.removeprefix(METADATA_PREFIX)
    return _document(request, protected_resource_metadata(request.app[SETTINGS].base_url, path))


async def elsewhere(request: web.Request) -> web.Response:
    if _DOCUMENTS.fullmatch(request.path):  # a document's path, another method than GET
        return json_error(405, "method not allowed", {"Allow": "GET, OPTIONS"})
    off = _off(request)
    if off is not None:
        return off
    return _not_here(
        request,
        "not here: this gateway's OAuth metadata is at "
        f"{AUTHORIZATION_SERVER_PATH}, and each MCP URL's at {METADATA_PREFIX} followed by "
        "the URL's path",
    )


def setup_discovery(app: web.Application) -> None:
    app.router.add_get(AUTHORIZATION_SERVER_PATH, authorization_server)
    app.router.add_route("OPTIONS", AUTHORIZATION_SERVER_PATH, _preflight)
    for path in _RESOURCE_PATHS:
        app.router.add_get(path, protected_resource)
        app.router.add_route("OPTIONS", path, _preflight)
    for path in _OTHER_PATHS:
        app.router.add_route("OPTIONS", path, _preflight)
        app.router.add_route("*", path, elsewhere)


_METADATA_SCHEMA = {"type": "object"}
# Any id in this form is answered alike (nothing is looked up): no "format": "uuid", which
# would make it read as one of a workspace's own ids.
_ID = {"type": "string", "pattern": "^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$"}


def _described(op_id: str, summary: str, *, with_id: str = "") -> dict[str, Any]:
    ok = {"content": {"application/json": {"schema": _METADATA_SCHEMA}}}
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {
        "get": {
            "tags": ["oauth"],
            "summary": summary,
            "operationId": op_id,
            "security": [],
            **(
                {"parameters": [{"name": with_id, "in": "path", "required": True, "schema": _ID}]}
                if with_id
                else {}
            ),
            "responses": {
                "200": {"description": "The metadata document", **ok},
                "404": {
                    "description": "OAuth is off on this gateway, or not an MCP URL",
                    **error,
                },
            },
        }
    }


OPENAPI_PATHS: dict[str, Any] = {
    AUTHORIZATION_SERVER_PATH: _described(
        "oauth_authorization_server_metadata", "Authorization server metadata (RFC 8414)"
    ),
    _RESOURCE_PATHS[0]: _described(
        "oauth_proxy_resource_metadata",
        "Protected resource metadata of a server's MCP URL (RFC 9728)",
        with_id="id",
    ),
    _RESOURCE_PATHS[1]: _described(
        "oauth_toolset_resource_metadata",
        "Protected resource metadata of a toolset's MCP URL (RFC 9728)",
        with_id="id",
    ),
}
