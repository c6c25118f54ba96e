"""The metadata documents MCP clients discover the gateway by (RFC 8414, RFC 9728), and OAuth
being off, saying why, when PUBLIC_URL is not https (or loopback)."""

from __future__ import annotations

import logging
import uuid

import pytest
from authlib.oauth2.rfc8414 import AuthorizationServerMetadata

from gateway.config import Settings
from gateway.oauth import oauth_enabled, oauth_refusal
from gateway.oauth.server import server_metadata
from tests.helpers.api import AppFactory
from tests.helpers.oauth import OAUTH_PUBLIC_URL, OAuthHttp

AS_PATH = "/.well-known/oauth-authorization-server"


async def test_the_authorization_server_metadata(http: OAuthHttp) -> None:
    reply = await http._call("GET", AS_PATH)
    assert reply.status == 200
    body = reply.body
    assert body["issuer"] == OAUTH_PUBLIC_URL
    assert body["authorization_endpoint"] == OAUTH_PUBLIC_URL + "/oauth/authorize"
    assert body["token_endpoint"] == OAUTH_PUBLIC_URL + "/oauth/token"
    assert body["registration_endpoint"] == OAUTH_PUBLIC_URL + "/oauth/register"
    assert body["revocation_endpoint"] == OAUTH_PUBLIC_URL + "/oauth/revoke"
    assert body["response_types_supported"] == ["code"]
    assert body["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert body["code_challenge_methods_supported"] == ["S256"]
    assert body["token_endpoint_auth_methods_supported"] == ["none"]
    assert body["client_id_metadata_document_supported"] is True
    assert body["authorization_response_iss_parameter_supported"] is True
    assert reply.headers["Access-Control-Allow-Origin"] == "*"


def test_the_document_is_valid_rfc_8414_under_an_https_public_url() -> None:
    # authlib's validator wants https endpoints, as production has.
    AuthorizationServerMetadata(server_metadata("https://gateway.example")).validate()


@pytest.mark.parametrize("kind", ["proxy", "toolsets"])
async def test_the_protected_resource_metadata_of_any_mcp_url(http: OAuthHttp, kind: str) -> None:
    # Any well-formed id: whether it exists is not told to strangers.
    some_id = uuid.uuid4()
    path = f"/api/v1/{kind}/{some_id}/mcp"
    reply = await http._call("GET", f"/.well-known/oauth-protected-resource{path}")
    assert reply.status == 200
    assert reply.body["resource"] == OAUTH_PUBLIC_URL + path
    assert reply.body["authorization_servers"] == [OAUTH_PUBLIC_URL]
    assert reply.body["bearer_methods_supported"] == ["header"]
    assert reply.headers["Access-Control-Allow-Origin"] == "*"


async def test_other_paths_under_the_prefix_are_json_404s(http: OAuthHttp) -> None:
    for path in (
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/api/v1/proxy/not-a-uuid/mcp",
        "/.well-known/oauth-protected-resource/api/v1/servers",
        "/.well-known/openid-configuration",
        "/register",
        "/token",
    ):
        reply = await http._call("GET", path)
        assert reply.status == 404, path
        assert set(reply.body) == {"detail"}, path


async def test_browsers_may_read_the_documents(http: OAuthHttp) -> None:
    reply = await http._call(
        "OPTIONS",
        AS_PATH,
        headers={
            "Origin": "http://localhost:6274",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "mcp-protocol-version",
        },
    )
    assert reply.status == 204
    assert reply.headers["Access-Control-Allow-Origin"] == "*"
    assert "mcp-protocol-version" in reply.headers["Access-Control-Allow-Headers"]


@pytest.mark.parametrize(
    ("public_url", "on"),
    [
        ("https://gateway.example", True),
        ("http://127.0.0.1:8080", True),
        ("http://[::1]:8080", True),
        ("http://localhost:8080", True),
        ("http://127.1.2.3", True),
        ("https://gateway.example.com:8443/prefix", True),
        ("http://gateway.example", False),
        ("http://10.0.0.5:8080", False),
        ("http://localhost.evil.example", False),
        ("http://127.0.0.1.nip.io", False),
    ],
)
def test_oauth_needs_an_https_or_loopback_public_url(public_url: str, on: bool) -> None:
    assert oauth_enabled(Settings(public_url=public_url)) is on
    assert oauth_enabled(Settings(public_url=public_url, oauth=False)) is False


def test_without_public_url_the_default_loopback_address_serves_oauth() -> None:
    assert oauth_enabled(Settings())
    assert not oauth_enabled(Settings(host="0.0.0.0"))


async def test_with_a_plain_http_public_url_oauth_is_off_and_says_why(
    make_api: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="gateway.oauth.endpoints")
    api = await make_api(public_url="http://gateway.test")
    assert any("PUBLIC_URL" in r.getMessage() for r in caplog.records)
    http = OAuthHttp(api.client.session, str(api.client.make_url("")))
    why = oauth_refusal(Settings(public_url="http://gateway.test"))
    assert why is not None and "PUBLIC_URL must be https" in why
    for method, path in (
        ("GET", AS_PATH),
        ("GET", f"/.well-known/oauth-protected-resource/api/v1/proxy/{uuid.uuid4()}/mcp"),
        ("POST", "/oauth/register"),
        ("POST", "/oauth/token"),
        ("POST", "/oauth/revoke"),
    ):
        reply = await http._call(method, path, json={} if path == "/oauth/register" else None)
        assert reply.status == 404, path
        assert "PUBLIC_URL must be https" in reply.body["detail"], path
    page = await http._call("GET", "/oauth/authorize", params={"client_id": "x"})
    assert page.status == 404 and "PUBLIC_URL must be https" in page.body
    # The gateway itself works: API keys and accounts as before.
    await api.signup()


async def test_the_documents_are_read_only(http: OAuthHttp) -> None:
    for path in (AS_PATH, f"/.well-known/oauth-protected-resource/api/v1/proxy/{uuid.uuid4()}/mcp"):
        reply = await http._call("POST", path)
        assert reply.status == 405 and reply.headers["Allow"] == "GET, OPTIONS", path
