"""POST /oauth/register (RFC 7591): public clients, redirect URIs checked, sizes bounded,
rate limited per address."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from tests.helpers.api import AppFactory
from tests.helpers.oauth import OAUTH_PUBLIC_URL, OAuthHttp


async def _count(db: asyncpg.Connection) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM oauth_clients")
    return count


async def test_a_public_client_is_registered(http: OAuthHttp, db: asyncpg.Connection) -> None:
    uris = [
        "https://app.example/callback",
        "http://127.0.0.1:3000/cb",
        "http://[::1]:3000/cb",
        "http://localhost:8000/cb",
        "com.example.app:/oauth/cb",
    ]
    reply = await http.register(uris, name="My agent", token_endpoint_auth_method="none")
    assert reply.status == 201, reply.body
    body = reply.body
    assert body["client_id"].startswith("mcpg-")
    assert body["client_name"] == "My agent" and body["redirect_uris"] == uris
    assert body["token_endpoint_auth_method"] == "none"
    assert "client_secret" not in body
    row = await db.fetchrow("SELECT * FROM oauth_clients WHERE client_id = $1", body["client_id"])
    assert row is not None
    assert row["registered"] and row["client_name"] == "My agent"


async def test_a_client_asking_for_a_secret_is_registered_public(http: OAuthHttp) -> None:
    reply = await http.register(token_endpoint_auth_method="client_secret_post")
    assert reply.status == 201
    assert reply.body["token_endpoint_auth_method"] == "none"
    assert "client_secret" not in reply.body


async def test_a_client_without_a_name_is_named_after_its_redirect_host(http: OAuthHttp) -> None:
    reply = await http.register(["https://agent.example/cb"], name=None)
    assert reply.status == 201 and reply.body["client_name"] == "agent.example"


@pytest.mark.parametrize(
    "uri",
    [
        "http://app.example/cb",  # http, not loopback
        "http://10.0.0.1/cb",
        "javascript:alert(1)",
        "data:text/html,hi",
        "https://app.example/cb#fragment",
        "https://user:pw@app.example/cb",
        "https:///no-host",
        "myapp:/cb",  # a private-use scheme needs a dot
        "https://app.example/" + "a" * 2000,
        "",
        42,
    ],
)
async def test_a_bad_redirect_uri_is_refused(
    http: OAuthHttp, db: asyncpg.Connection, uri: Any
) -> None:
    reply = await http.register([uri])
    assert reply.status == 400, reply.body
    assert reply.body["error"] == "invalid_redirect_uri", reply.body
    assert await _count(db) == 0


async def test_bad_metadata_is_refused(http: OAuthHttp, db: asyncpg.Connection) -> None:
    for body, error in (
        ({"client_name": "x"}, "invalid_redirect_uri"),  # no redirect_uris
        ({"redirect_uris": []}, "invalid_redirect_uri"),
        ({"redirect_uris": ["https://a.example/cb"] * 11}, "invalid_redirect_uri"),
        (
            {"redirect_uris": ["https://a.example/cb"], "client_name": "n" * 201},
            "invalid_client_metadata",
        ),
        (
            {"redirect_uris": ["https://a.example/cb"], "grant_types": ["password"]},
            "invalid_client_metadata",
        ),
    ):
        reply = await http._call("POST", "/oauth/register", json=body)
        assert reply.status == 400, (body, reply.body)
        assert reply.body["error"] == error, (body, reply.body)
    for raw in (b"[]", b"not json", b'"text"'):
        reply = await http._call(
            "POST", "/oauth/register", data=raw, headers={"Content-Type": "application/json"}
        )
        assert reply.status == 400 and reply.body["error"] == "invalid_client_metadata"
    assert await _count(db) == 0


async def test_a_registration_over_64_kib_is_refused(
    http: OAuthHttp, db: asyncpg.Connection
) -> None:
    body = {
        "redirect_uris": ["https://a.example/cb"],
        "client_uri": "https://a.example/",
        "padding": "x" * (64 * 1024),
    }
    reply = await http._call("POST", "/oauth/register", json=body)
    assert reply.status == 413 and reply.body["error"] == "invalid_client_metadata"
    assert await _count(db) == 0


async def test_registration_is_rate_limited_per_address(make_api: AppFactory) -> None:
    api = await make_api(public_url=OAUTH_PUBLIC_URL, auth_rate_limit="3/minute")
    http = OAuthHttp(api.client.session, str(api.client.make_url("")))
    for _ in range(3):
        assert (await http.register()).status == 201
    reply = await http.register()
    assert reply.status == 429 and int(reply.headers["Retry-After"]) > 0
    assert reply.body["error"] == "temporarily_unavailable"


async def test_browser_clients_may_register(http: OAuthHttp) -> None:
    origin = {"Origin": "http://localhost:6274"}
    preflight = await http._call(
        "OPTIONS",
        "/oauth/register",
        headers={**origin, "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "*"
    reply = await http._call(
        "POST",
        "/oauth/register",
        json={"redirect_uris": ["http://localhost:6274/cb"]},
        headers=origin,
    )
    assert reply.status == 201 and reply.headers["Access-Control-Allow-Origin"] == "*"
