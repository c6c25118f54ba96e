"""The OpenAPI document: valid 3.1, complete, served with a docs page; and the contract checker
that holds every test response to it."""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from cryptography.fernet import Fernet
from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator, validate

from gateway.accounts.access import PUBLIC
from gateway.api.models import EMAIL_PATTERN, NUL_FREE, TRIMMED, URL_PATTERN, Email, HttpUrl, Out
from gateway.api.openapi import DOCS_INIT, DOCS_STATIC, OPENAPI_DOCUMENT, build_document
from gateway.api.routing import API_PREFIX, Routes, mount
from gateway.app import create_app
from gateway.config import Settings
from gateway.errors import NotFound, error_middleware
from tests.helpers.api import Api
from tests.helpers.contract import ContractChecker

# Where OAuth's documented routes are, outside the API (gateway/oauth, gateway/api/discovery).
OAUTH_PATHS = (
    "/oauth/",
    "/.well-known/oauth-authorization-server",
    "/.well-known/oauth-protected-resource/api/",
)

ClientFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]


@pytest.fixture(scope="module")
def app() -> web.Application:
    """Built, never started: the document needs no database."""
    settings = Settings(
        database_url="postgresql://localhost/unused",
        jwt_secret="x" * 40,
        secret_keys=(Fernet.generate_key().decode(),),
    )
    return create_app(settings)


@pytest.fixture(scope="module")
def document(app: web.Application) -> dict[str, Any]:
    return app[OPENAPI_DOCUMENT]


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"] == "3.1.0"
    assert document["info"]["title"] == "mcp-gateway"
    validate(document, cls=OpenAPIV31SpecValidator)


def test_the_document_lists_every_api_route_of_the_app(
    app: web.Application, document: dict[str, Any]
) -> None:
    routed = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None
        and (
            route.resource.canonical.startswith(API_PREFIX)
            # The load balancers' routes, outside the API but documented with it.
            or route.resource.canonical in ("/healthz", "/readyz")
            # OAuth's endpoints and metadata documents (their CORS preflights aside).
            or (
                route.resource.canonical.startswith(OAUTH_PATHS)
                and route.method != "OPTIONS"
                and "{name" not in route.resource.canonical
            )
        )
        and not route.resource.canonical.startswith(DOCS_STATIC)
        and route.method != "HEAD"
    }
    documented = {(method, path) for path, item in document["paths"].items() for method in item}
    assert routed == documented
    for path in ("/auth/signup", "/auth/me", "/workspaces/{workspace_id}/api-keys/{key_id}"):
        assert API_PREFIX + path in document["paths"]


def test_every_operation_documents_its_parameters_security_and_errors(
    document: dict[str, Any],
) -> None:
    operation_ids = []
    for path, item in document["paths"].items():
        placeholders = re.findall(r"{(\w+)}", path)
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            operation_ids.append(op["operationId"])
            assert op["summary"] and op["tags"], where
            path_params = [p["name"] for p in op.get("parameters", []) if p["in"] == "path"]
            assert path_params == placeholders, where
            responses = op["responses"]
            if op["security"]:
                assert "401" in responses, where
            for status, response in responses.items():
                if path.startswith("/oauth/") and "text/html" in response.get("content", {}):
                    continue  # the authorize endpoint's pages
                if path.startswith("/oauth/") and int(status) >= 400 and status != "404":
                    # RFC 6749 errors; 404 is the gateway's own {"detail"}: OAuth is off.
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/OAuthError"}, where
                    continue
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    # Errors are {"detail"}, but for the MCP endpoints' own refusals, which
                    # answer MCP clients in JSON-RPC: an unreadable body (400), a tools/call
                    # the rules refuse (403) or rate-limit (429), the last two beside
                    # {"detail"} refusals of the whole request.
                    mcp_post = path.endswith("/mcp") and method == "post"
                    if mcp_post and status in ("403", "429"):
                        refs = {
                            s.get("$ref", s.get("items", {}).get("$ref")) for s in schema["anyOf"]
                        }
                        assert refs == {
                            "#/components/schemas/Refusal",
                            "#/components/schemas/JsonRpcErrorResponse",
                        }, where
                        continue
                    # A toolset's endpoint also answers a session it does not know (404) so,
                    # beside {"detail"} for a toolset it does not know.
                    toolset = path.startswith("/api/v1/toolsets/") and path.endswith("/mcp")
                    if toolset and status == "404" and method in ("post", "delete"):
                        refs = {s["$ref"] for s in schema["anyOf"]}
                        assert refs == {
                            "#/components/schemas/Refusal",
                            "#/components/schemas/JsonRpcErrorResponse",
                        }, where
                        continue
                    own = (path.endswith("/mcp"), status) == (True, "400")
                    expected = "JsonRpcErrorResponse" if own else "Error"
                    assert schema == {"$ref": f"#/components/schemas/{expected}"}, where
    assert len(operation_ids) == len(set(operation_ids))
    assert document["components"]["schemas"]["Error"]["required"] == ["detail"]


def _texts(schema: Any, components: dict[str, Any], seen: set[str]) -> list[dict[str, Any]]:
    """Every string schema reachable from a schema."""
    if isinstance(schema, list):
        return [t for item in schema for t in _texts(item, components, seen)]
    if not isinstance(schema, dict):
        return []
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if name in seen:
            return []
        seen.add(name)
        return _texts(components[name], components, seen)
    found = [schema] if schema.get("type") == "string" else []
    return found + [t for value in schema.values() for t in _texts(value, components, seen)]


def test_every_text_a_client_sends_states_what_it_may_hold(document: dict[str, Any]) -> None:
    """Texts are refused with a NUL character (and some with more): the document says so with a
    pattern on each, so a request it allows is not refused for an unstated reason."""
    components = document["components"]["schemas"]
    unstated = []
    for path, item in document["paths"].items():
        for method, op in item.items():
            inputs = [p["schema"] for p in op.get("parameters", [])]
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body is not None:
                inputs.append(body["schema"])
            for text in _texts(inputs, components, set()):
                free = "pattern" not in text and "enum" not in text and "const" not in text
                if free and text.get("format") not in ("uuid", "date-time", "email"):
                    unstated.append(f"{method.upper()} {path}: {text}")
    assert not unstated, "\n".join(unstated)


def test_the_documented_patterns_agree_with_the_validators() -> None:
    """What a pattern admits, the validator takes; what it refuses is refused or described."""
    for text in ("a", "a b", "ünïcode"):
        assert re.search(TRIMMED, text)
    for text in (" a", "a ", "", "a\x00b"):
        assert not re.search(TRIMMED, text)
    url = pydantic.TypeAdapter(HttpUrl)
    for good in ("http://a.example/x", "HTTPS://10.0.0.5:8443/mcp?x=1", "http://a_b:1/"):
        assert re.search(URL_PATTERN, good) and url.validate_python(good) == good
    bad_urls = ("http://0/", "http://127.1/", "http://1.2.3.04/", "ftp://a/", "http://a..b/")
    for bad in (*bad_urls, "http://a b/", "http://u@h/"):
        assert not re.search(URL_PATTERN, bad)
        with pytest.raises(pydantic.ValidationError):
            url.validate_python(bad)
    # Refused by the outbound policy at registration (and never dialled): not offered either.
    assert not re.search(URL_PATTERN, "http://169.254.169.254/latest")
    email = pydantic.TypeAdapter(Email)
    assert re.search(EMAIL_PATTERN, "a@b.example") and email.validate_python("a@b.example")
    for bad in ("a@b", "a@b.0", "a@host.local", "a@x.TEST", "a@b.onion"):
        assert not re.search(EMAIL_PATTERN, bad)
        with pytest.raises(pydantic.ValidationError):
            email.validate_python(bad)


def test_auth_and_workspace_operations_say_what_they_need(document: dict[str, Any]) -> None:
    paths = document["paths"]
    signup = paths[f"{API_PREFIX}/auth/signup"]["post"]
    assert signup["security"] == []
    assert {"201", "400", "403", "422", "429"} <= set(signup["responses"])
    assert "Retry-After" in signup["responses"]["429"]["headers"]
    assert paths[f"{API_PREFIX}/auth/me"]["get"]["security"] == [{"bearer": []}]
    accept = paths[f"{API_PREFIX}/auth/accept-invite/{{token}}"]["post"]
    assert accept["parameters"][0]["schema"] == {"type": "string", "pattern": NUL_FREE}
    delete_ws = paths[f"{API_PREFIX}/workspaces/{{workspace_id}}"]["delete"]
    assert delete_ws["parameters"][0]["schema"] == {"type": "string", "format": "uuid"}
    assert set(delete_ws["responses"]) == {"204", "400", "401", "403", "404"}
    assert "owner" in delete_ws["description"]
    token_response = signup["responses"]["201"]["content"]["application/json"]["schema"]
    assert token_response == {"$ref": "#/components/schemas/TokenResponse"}
    token_schema = document["components"]["schemas"]["TokenResponse"]
    assert set(token_schema["required"]) == {
        "access_token",
        "refresh_token",
        "token_type",
        "expires_in",
        "user",
        "workspace",
    }
    member = document["components"]["schemas"]["MemberOut"]
    assert set(member["properties"]) == {"user_id", "email", "name", "role", "joined_at"}


async def test_the_document_and_docs_page_are_served(api: Api) -> None:
    served = await api.get("/openapi.json", expect=200)
    assert served.body == api.app[OPENAPI_DOCUMENT]
    docs = await api.get("/docs", expect=200)
    assert docs.headers["Content-Type"].startswith("text/html")
    assert f'<script src="{DOCS_INIT}">' in docs.body
    init = await api.get(DOCS_INIT, expect=200)
    assert "SwaggerUIBundle" in init.body
    assert f"{API_PREFIX}/openapi.json" in init.body
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        assert f"{DOCS_STATIC}/{asset}" in docs.body
        reply = await api.get(f"{DOCS_STATIC}/{asset}", expect=200)
        assert len(reply.body) > 1000
    await api.get(f"{DOCS_STATIC}/index.j2.missing", expect=404)
    await api.get(f"{DOCS_STATIC}/..%2F__init__.py", expect=404)


async def test_the_docs_pages_carry_the_dashboards_security_headers(api: Api) -> None:
    """They share the dashboard's origin: a page there that could be framed, or that ran
    scripts from elsewhere, would open the dashboard to clickjacking and injected script."""
    for path in ("/docs", DOCS_INIT, f"{DOCS_STATIC}/swagger-ui-bundle.js"):
        reply = await api.get(path, expect=200)
        policy = reply.headers["Content-Security-Policy"]
        assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy, path
        assert reply.headers["X-Frame-Options"] == "DENY", path
        assert reply.headers["X-Content-Type-Options"] == "nosniff", path
    docs = await api.get("/docs", expect=200)
    assert "<script>" not in docs.body  # no inline script: the policy would refuse it


# -- the contract checker itself ------------------------------------------------------------


class Thing(Out):
    id: int
    name: str


_broken = Routes("broken")


@_broken.get("/thing", summary="returns a field of the wrong type", access=PUBLIC, response=Thing)
async def wrong_type(request: web.Request) -> dict[str, Any]:
    return {"id": "seven", "name": "x"}


@_broken.get("/extra", summary="returns an undocumented field", access=PUBLIC, response=Thing)
async def extra_field(request: web.Request) -> dict[str, Any]:
    return {"id": 7, "name": "x", "secret": "leaked"}


@_broken.get("/missing", summary="answers an undocumented 404", access=PUBLIC, response=Thing)
async def undocumented_status(request: web.Request) -> dict[str, Any]:
    raise NotFound("no such thing")


@_broken.get("/fine", summary="answers as documented", access=PUBLIC, response=Thing)
async def fine(request: web.Request) -> dict[str, Any]:
    return {"id": 7, "name": "x"}


@_broken.get("/crash", summary="raises", access=PUBLIC, response=Thing)
async def crash(request: web.Request) -> dict[str, Any]:
    raise RuntimeError("boom")


async def test_the_contract_checker_catches_responses_that_break_the_document(
    aiohttp_client: ClientFactory,
) -> None:
    app = web.Application(middlewares=[error_middleware])
    app[OPENAPI_DOCUMENT] = build_document(mount(app, [_broken]), "test")
    checker = ContractChecker(app)
    app.middlewares.insert(0, checker.middleware)
    client = await aiohttp_client(app)

    for path in ("fine", "thing", "extra", "missing", "crash"):
        async with client.get(f"{API_PREFIX}/{path}") as response:
            await response.read()

    violations = "\n".join(checker.violations)
    assert len(checker.violations) == 4, violations
    assert "GET /api/v1/thing -> 200: at 'id'" in violations
    assert "GET /api/v1/extra -> 200" in violations and "secret" in violations
    assert "GET /api/v1/missing -> 404: status not in the OpenAPI document" in violations
    assert "GET /api/v1/crash -> 500: server error" in violations
    assert "/fine" not in violations
    with pytest.raises(AssertionError, match="responses that break the OpenAPI document"):
        checker.assert_clean()


def test_bodies_parsed_by_their_handler_are_documented_too(document: dict[str, Any]) -> None:
    """POST /tool-calls reads one object or an array itself; the document says both."""
    operation = document["paths"]["/api/v1/tool-calls"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    validator = Draft202012Validator({**schema, "components": document["components"]})
    call = {"server_id": str(uuid.uuid4()), "tool_name": "search", "status": "success"}
    assert validator.is_valid(call)
    assert validator.is_valid([call, {**call, "status": "error"}])
    assert not validator.is_valid({"tool_name": "search", "status": "success"})
    assert not validator.is_valid({**call, "status": "maybe"})


def test_every_patch_documents_its_body(document: dict[str, Any]) -> None:
    patches = [path for path, item in document["paths"].items() if "patch" in item]
    assert patches
    for path in patches:
        assert "requestBody" in document["paths"][path]["patch"], path
