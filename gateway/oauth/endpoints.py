"""The authorization server's JSON endpoints: registration (RFC 7591), token and revocation
(RFC 7009), with their rate limits, CORS and OpenAPI entries; and the server's assembly.

Each reads the request on the event loop, hands it to authlib (gateway.oauth.server) and
answers what authlib answers: RFC errors (`{"error", "error_description"}`), never a page.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from multidict import MultiDict, MultiDictProxy

from gateway.accounts.ratelimit import RATE_LIMITER, client_address
from gateway.api.routing import read_bytes
from gateway.errors import ApiError, TooManyRequests, json_error
from gateway.keys import HTTP, POOL, SETTINGS
from gateway.oauth import oauth_refusal
from gateway.oauth.clients import CLIENTS, DOCUMENT_SSL, Clients
from gateway.oauth.server import (
    OAUTH_SERVER,
    REGISTER_PATH,
    REVOKE_PATH,
    TOKEN_PATH,
    Answer,
    Bridge,
    GatewayAuthorizationServer,
    Incoming,
)
from gateway.proxy import cors

log = logging.getLogger(__name__)

REGISTRATION_MAX_BYTES = 64 * 1024


class OAuthOff(ApiError):
    """OAuth is not served by this gateway (PUBLIC_URL, or GATEWAY_OAUTH=off): 404 saying why."""

    status = 404


def oauth_server(request: web.Request) -> GatewayAuthorizationServer:
    server = request.app.get(OAUTH_SERVER)
    if server is None:
        raise OAuthOff(oauth_refusal(request.app[SETTINGS]) or "OAuth is off")
    return server


def _rfc_error(
    status: int, error: str, description: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps({"error": error, "error_description": description}),
        content_type="application/json",
        headers={"Cache-Control": "no-store", **(headers or {})},
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _endpoint(handler: Handler) -> Handler:
    """CORS for browser clients (no cookie is ever read here), preflights, and the gateway's
    own refusals as JSON: OAuth off ({"detail"}), too many attempts, a body too slow."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.method == "OPTIONS":
            return web.Response(
                status=204,
                headers={
                    **cors.ANSWER_HEADERS,
                    "Access-Control-Allow-Methods": "POST, OPTIONS",
                    "Access-Control-Allow-Headers": "Authorization, Content-Type, Accept, "
                    "MCP-Protocol-Version",
                    "Access-Control-Max-Age": "86400",
                },
            )
        try:
            response = await handler(request)
        except OAuthOff as exc:
            response = json_error(404, exc.detail)
        except TooManyRequests as exc:
            response = _rfc_error(429, "temporarily_unavailable", exc.detail, exc.headers)
        except ApiError as exc:  # a body too slow (408)
            response = _rfc_error(exc.status, "invalid_request", exc.detail, exc.headers)
        if "Origin" in request.headers:
            response.headers.update(cors.ANSWER_HEADERS)
        return response

    return handle


def _address(request: web.Request) -> str:
    return client_address(request, request.app[SETTINGS].trusted_proxies)


async def _read_form(request: web.Request, server: GatewayAuthorizationServer) -> Incoming:
    await read_bytes(request)  # within the body timeout; post() then parses it
    try:
        form = await request.post()
    except (UnicodeDecodeError, ValueError):
        form = None  # authlib refuses the missing parameters
    fields = {k: v for k, v in form.items() if isinstance(v, str)} if form is not None else {}

    return await Incoming.read(request, server.issuer, form=MultiDictProxy(MultiDict(fields)))


async def register(request: web.Request) -> web.StreamResponse:
    server = oauth_server(request)
    await request.app[RATE_LIMITER].hit(f"oauth-register:{_address(request)}")
    too_big = f"a client registration may be at most {REGISTRATION_MAX_BYTES // 1024} KiB"
    if (request.content_length or 0) > REGISTRATION_MAX_BYTES:
        return _rfc_error(413, "invalid_client_metadata", too_big)
    raw = await read_bytes(request)
    if len(raw) > REGISTRATION_MAX_BYTES:
        return _rfc_error(413, "invalid_client_metadata", too_big)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        return _rfc_error(400, "invalid_client_metadata", "the registration must be a JSON object")
    incoming = await Incoming.read(request, server.issuer, json=body)
    answer: Answer = await server.bridge.run(
        server.create_endpoint_response, "client_registration", incoming
    )
    return answer.response({"Cache-Control": "no-store"})


async def token(request: web.Request) -> web.StreamResponse:
    server = oauth_server(request)
    limiter = request.app[RATE_LIMITER]
    key = f"oauth-token:{_address(request)}"
    wait = await limiter.exhausted(key)
    if wait is not None:
        raise TooManyRequests(f"too many failed attempts, retry in {wait} s", retry_after=wait)
    incoming = await _read_form(request, server)
    answer: Answer = await server.bridge.run(server.create_token_response, incoming)
    if answer.status >= 400:
        await limiter.hit(key)  # failures only count
    return answer.response({"Cache-Control": "no-store", "Pragma": "no-cache"})


async def revoke(request: web.Request) -> web.StreamResponse:
    server = oauth_server(request)
    incoming = await _read_form(request, server)
    answer: Answer = await server.bridge.run(
        server.create_endpoint_response, "revocation", incoming
    )
    return answer.response({"Cache-Control": "no-store"})


def setup_oauth(app: web.Application) -> None:
    """The JSON endpoints and the authorize page (whose module needs the dashboard's pages)."""
    from gateway.oauth import consent

    for path, handler in ((REGISTER_PATH, register), (TOKEN_PATH, token), (REVOKE_PATH, revoke)):
        app.router.add_route("POST", path, _endpoint(handler))
        app.router.add_route("OPTIONS", path, _endpoint(handler))
    app.router.add_routes(consent.pages.routes)


async def oauth_context(app: web.Application) -> AsyncIterator[None]:
    """The authorization server, after the pool and the HTTP client it uses; none when OAuth is
    off (its endpoints then answer 404 saying why)."""
    settings = app[SETTINGS]
    refusal = oauth_refusal(settings)
    if refusal is not None:
        if settings.oauth:  # not switched off on purpose: PUBLIC_URL is wrong
            log.error("%s (API keys work as before)", refusal)
        yield
        return
    bridge = Bridge(asyncio.get_running_loop())
    context = app.get(DOCUMENT_SSL) or ssl.create_default_context()
    clients = Clients(app[POOL], app[HTTP], context)
    app[CLIENTS] = clients
    app[OAUTH_SERVER] = GatewayAuthorizationServer(settings, app[POOL], clients, bridge)
    yield
    bridge.close()


# -- OpenAPI -----------------------------------------------------------------------------------

# The shape of every OAuth error (RFC 6749 5.2), a component of the document.
OPENAPI_SCHEMAS: dict[str, Any] = {
    "OAuthError": {
        "type": "object",
        "properties": {"error": {"type": "string"}, "error_description": {"type": "string"}},
        "required": ["error"],
        "title": "OAuthError",
    }
}
_OAUTH_ERROR = {"$ref": "#/components/schemas/OAuthError"}
_ERROR = {"$ref": "#/components/schemas/Error"}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _form_body(required: list[str], fields: list[str]) -> dict[str, Any]:
    return {
        "required": True,
        "content": {
            "application/x-www-form-urlencoded": {
                "schema": {
                    "type": "object",
                    "properties": {name: {"type": "string"} for name in fields},
                    "required": required,
                }
            }
        },
    }


_OFF = _json("OAuth is off on this gateway (PUBLIC_URL not https, or GATEWAY_OAUTH=off)", _ERROR)
_LIMITED = _json("Too many attempts from this address", _OAUTH_ERROR)
_OBJECT = {"type": "object"}


def _operation(op_id: str, summary: str, responses: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "tags": ["oauth"],
        "summary": summary,
        "operationId": op_id,
        "security": [],
        "responses": responses,
        **more,
    }


_REDIRECT = {
    "description": "To the client's redirect URI (code or error, state, iss), or to the login page"
}
_PAGE = {"description": "A page", "content": {"text/html": {"schema": {"type": "string"}}}}

OPENAPI_PATHS: dict[str, Any] = {
    REGISTER_PATH: {
        "post": _operation(
            "oauth_register",
            "Register a public OAuth client (RFC 7591)",
            {
                "201": _json("The client's information (no secret: public clients only)", _OBJECT),
                "400": _json("invalid_redirect_uri or invalid_client_metadata", _OAUTH_ERROR),
                "404": _OFF,
                "408": _json("The body did not arrive in time", _OAUTH_ERROR),
                "413": _json("The registration is larger than 64 KiB", _OAUTH_ERROR),
                "429": _LIMITED,
            },
            requestBody={"required": True, "content": {"application/json": {"schema": _OBJECT}}},
        )
    },
    TOKEN_PATH: {
        "post": _operation(
            "oauth_token",
            "Exchange an authorization code (PKCE S256), or a refresh token (rotated)",
            {
                "200": _json("An access token for one MCP URL, and a refresh token", _OBJECT),
                "400": _json(
                    "An RFC 6749 error (invalid_grant, invalid_target, ...)", _OAUTH_ERROR
                ),
                "401": _json("invalid_client", _OAUTH_ERROR),
                "404": _OFF,
                "408": _json("The body did not arrive in time", _OAUTH_ERROR),
                "429": _LIMITED,
            },
            requestBody=_form_body(
                ["grant_type", "client_id"],
                [
                    "grant_type",
                    "client_id",
                    "code",
                    "redirect_uri",
                    "code_verifier",
                    "refresh_token",
                    "resource",
                ],
            ),
        )
    },
    REVOKE_PATH: {
        "post": _operation(
            "oauth_revoke",
            "Revoke a refresh or access token: its grant ends (RFC 7009)",
            {
                "200": _json("Revoked, or not a token of this client (RFC 7009 2.2)", _OBJECT),
                "400": _json("An RFC 7009 error", _OAUTH_ERROR),
                "401": _json("invalid_client", _OAUTH_ERROR),
                "404": _OFF,
                "408": _json("The body did not arrive in time", _OAUTH_ERROR),
            },
            requestBody=_form_body(
                ["token", "client_id"], ["token", "token_type_hint", "client_id"]
            ),
        )
    },
    "/oauth/authorize": {
        "get": _operation(
            "oauth_authorize",
            "Authorization endpoint: sign in, then the consent page (a browser page)",
            {
                "200": _PAGE,
                "302": _REDIRECT,
                "303": _REDIRECT,
                "400": _PAGE,
                "403": _PAGE,
                "404": _PAGE,
            },
        ),
        "post": _operation(
            "oauth_consent",
            "Allow or Deny, from the consent page (with the dashboard's CSRF token)",
            {"302": _REDIRECT, "400": _PAGE, "403": _PAGE, "404": _PAGE},
        ),
    },
}
