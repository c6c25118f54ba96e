"""The OpenAPI 3.1 document, built from the same declarations and models the handlers use."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pydantic
from aiohttp import web

from gateway.accounts.access import PUBLIC
from gateway.api import discovery
from gateway.api.models import NUL_FREE, DocumentSchema
from gateway.api.routing import API_PREFIX, Endpoint, Routes, json_response
from gateway.oauth import endpoints as oauth_endpoints
from gateway.ops.readiness import OPENAPI_PATHS

_REF = "#/components/schemas/{model}"
_UUID_SCHEMA = {"type": "string", "format": "uuid"}

_SECURITY_SCHEMES = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "an access token (a JWT from /auth/login or /auth/signup), or an API key "
        "(`mcpg_…`): the prefix tells them apart, and a key sent this way is used as in "
        "X-API-Key. When both headers come, the bearer one is used. On the MCP URLs (proxy and "
        "toolsets), also an OAuth access token issued for that URL.",
    },
    "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
}

_ERROR_SCHEMA = {
    "type": "object",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
    "title": "Error",
}


class _Components:
    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {"Error": _ERROR_SCHEMA}

    def schema_of(self, annotation: Any, mode: str) -> dict[str, Any]:
        schema = pydantic.TypeAdapter(annotation).json_schema(
            ref_template=_REF,
            mode=mode,  # type: ignore[arg-type]
            schema_generator=DocumentSchema,
        )
        self.schemas.update(schema.pop("$defs", {}))
        if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
            name = annotation.__name__
            self.schemas[name] = schema
            return {"$ref": _REF.format(model=name)}
        return schema


def _parameters(endpoint: Endpoint, components: _Components) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": _UUID_SCHEMA
            if kind is uuid.UUID
            else {"type": "string", "pattern": NUL_FREE},
        }
        for name, kind in endpoint.path_params
    ]
    if endpoint.query is not None:
        schema = endpoint.query.model_json_schema(
            ref_template=_REF, schema_generator=DocumentSchema
        )
        required = set(schema.get("required", []))
        for name, prop in schema.get("properties", {}).items():
            param = {"name": name, "in": "query", "required": name in required, "schema": prop}
            if "description" in prop:
                param["description"] = prop["description"]
            params.append(param)
    return params


def _operation(endpoint: Endpoint, components: _Components) -> dict[str, Any]:
    op: dict[str, Any] = {
        "tags": [endpoint.tag],
        "summary": endpoint.summary,
        "operationId": f"{endpoint.method.lower()}_{endpoint.path}".replace("/", "_")
        .replace("{", "")
        .replace("}", "")
        .replace("-", "_"),
    }
    if endpoint.description:
        op["description"] = endpoint.description
    access = endpoint.access
    if not access.authenticated:
        op["security"] = []
        if not access.api_key:
            op["description"] = (
                f"{op.get('description', '')}\n\nNo credentials needed; an API key is refused."
            ).strip()
    else:
        op["security"] = [{"bearer": []}, {"apiKey": []}] if access.api_key else [{"bearer": []}]
        if access.min_role is not None:
            op["description"] = (
                f"{op.get('description', '')}\n\nRequires role: {access.min_role} or higher"
                f"{' (API keys allowed)' if access.api_key else ''}."
            ).strip()
    params = _parameters(endpoint, components)
    if params:
        op["parameters"] = params
    body = endpoint.body if endpoint.body is not None else endpoint.request_body
    if body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": components.schema_of(body, "validation")}},
        }
    success: dict[str, Any] = {"description": HTTPStatus(endpoint.status).phrase}
    if endpoint.response is not None:
        success["content"] = {
            endpoint.media_type: {
                "schema": components.schema_of(endpoint.response, "serialization")
            }
        }
    responses: dict[str, Any] = {str(endpoint.status): success}
    for code in endpoint.bodiless:
        responses[str(code)] = {"description": HTTPStatus(code).phrase}
    error_bodies = dict(endpoint.error_bodies)
    for code in sorted({*endpoint.errors, *error_bodies}):
        shape = error_bodies.get(code)
        schema = (
            {"$ref": _REF.format(model="Error")}
            if shape is None
            else components.schema_of(shape, "serialization")
        )
        responses[str(code)] = {
            "description": HTTPStatus(code).phrase,
            "content": {"application/json": {"schema": schema}},
        }
        if code == 401 and access.oauth:
            # The MCP URLs are OAuth protected resources (RFC 9728 5.1).
            responses[str(code)]["headers"] = {
                "WWW-Authenticate": {
                    "description": "`Bearer`; when the gateway offers OAuth, with "
                    '`resource_metadata="<the URL\'s protected resource metadata>"`, and '
                    '`error="invalid_token"` when the credential sent was refused',
                    "schema": {"type": "string"},
                }
            }
        if code == 429:
            responses[str(code)]["headers"] = {
                "Retry-After": {
                    "description": "seconds to wait before trying again",
                    "schema": {"type": "integer"},
                }
            }
    op["responses"] = responses
    return op


def build_document(endpoints: Iterable[Endpoint], version: str) -> dict[str, Any]:
    components = _Components()
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(API_PREFIX + endpoint.path, {})[endpoint.method.lower()] = _operation(
            endpoint, components
        )
    paths.update(OPENAPI_PATHS)
    paths.update(discovery.OPENAPI_PATHS)
    paths.update(oauth_endpoints.OPENAPI_PATHS)
    components.schemas.update(oauth_endpoints.OPENAPI_SCHEMAS)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mcp-gateway",
            "version": version,
            "description": (
                "Multi-tenant gateway and monitoring service for MCP servers. Every error is "
                '`{"detail": "..."}`. Timestamps are ISO 8601 UTC; ids are UUIDs. URLs the '
                "gateway hands out (a server's `proxy_url`, invitation links) start with the "
                "PUBLIC_URL setting: the address users and agents reach it at, behind any "
                "reverse proxy (default `http://{GATEWAY_HOST}:{GATEWAY_PORT}`)."
            ),
        },
        "paths": paths,
        "components": {"schemas": components.schemas, "securitySchemes": _SECURITY_SCHEMES},
    }


routes = Routes("meta")

_DOCS_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>mcp-gateway API</title>
<link rel="stylesheet" href="{static}/swagger-ui.css"></head>
<body><div id="ui"></div>
<script src="{static}/swagger-ui-bundle.js"></script>
<script src="{init}"></script>
</body></html>"""

DOCS_STATIC = "/api/v1/docs/static"
# The script that starts Swagger UI (a file: the policy below refuses inline script).
DOCS_INIT = f"{DOCS_STATIC}/init.js"
_INIT_SCRIPT = f'SwaggerUIBundle({{url: "{API_PREFIX}/openapi.json", dom_id: "#ui"}});\n'

# The docs pages share the dashboard's origin: they get its protections (no framing, no
# sniffing, scripts only from here). Swagger UI sets inline styles, so those are allowed.
DOCS_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; form-action 'none'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}


@routes.get(
    "/openapi.json", summary="This OpenAPI document", access=PUBLIC, response=dict[str, Any]
)
async def openapi_json(request: web.Request) -> web.Response:
    return json_response(request.app[OPENAPI_DOCUMENT])


@routes.get(
    "/docs",
    summary="Human-readable API documentation (Swagger UI)",
    access=PUBLIC,
    response=str,
    media_type="text/html",
)
async def docs_page(request: web.Request) -> web.Response:
    page = _DOCS_PAGE.format(static=DOCS_STATIC, init=DOCS_INIT)
    return web.Response(text=page, content_type="text/html", headers=DOCS_HEADERS)


def add_docs_static(app: web.Application) -> None:
    """Swagger UI's files (only those it ships, read from its package) and the script that
    starts it, each with DOCS_HEADERS."""
    # swagger-ui-py ships Swagger UI 5, which reads OpenAPI 3.1 (older bundles cannot). Its
    # folder is found without importing the package, which would load PyYAML and urllib's
    # client for nothing (a megabyte of every process).
    spec = importlib.util.find_spec("swagger_ui")
    assert spec is not None and spec.submodule_search_locations, "swagger-ui-py is installed"
    folder = Path(spec.submodule_search_locations[0]) / "static"
    files = {path.name: path for path in folder.iterdir() if path.name.startswith("swagger-ui")}

    async def static(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if DOCS_STATIC + "/" + name == DOCS_INIT:
            return web.Response(
                text=_INIT_SCRIPT, content_type="application/javascript", headers=DOCS_HEADERS
            )
        path = files.get(name)
        if path is None:
            raise web.HTTPNotFound()
        return web.FileResponse(path, headers=DOCS_HEADERS)

    app.router.add_get(DOCS_STATIC + "/{name}", static)


OPENAPI_DOCUMENT: web.AppKey[dict[str, Any]] = web.AppKey("openapi_document")
