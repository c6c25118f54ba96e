"""Every failure is {"detail": "..."} with the status of API_DECISIONS.md's table."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.config import Settings
from gateway.db import users as users_db
from tests.helpers.api import Api, AppFactory

ClientFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]


async def test_unknown_routes_are_404_and_wrong_methods_405_with_detail(api: Api) -> None:
    for path in ("/api/v1/no-such-thing", "/api/v2/auth/me", "/nowhere"):
        reply = await api.get(path, expect=404)
        assert reply.body == {"detail": "not found"}
        assert reply.headers["Content-Type"].startswith("application/json")
    reply = await api.request("PUT", "/auth/me", expect=405)
    assert reply.body == {"detail": "method not allowed"}
    assert "GET" in reply.headers["Allow"]
    reply = await api.delete("/auth/login", expect=405)
    assert reply.headers["Allow"] == "POST"


async def test_body_over_the_limit_is_413(make_api: AppFactory) -> None:
    api = await make_api(max_body_bytes=1024)
    reply = await api.post(
        "/auth/signup",
        json={"email": "ada@example.com", "password": "password123", "name": "A" * 2000},
        expect=413,
    )
    assert reply.body == {"detail": "request body too large"}
    # Just under the limit is fine.
    await api.post(
        "/auth/signup",
        json={"email": "ada@example.com", "password": "password123", "name": "A" * 100},
        expect=201,
    )


async def test_malformed_bodies_are_400_and_invalid_ones_422(api: Api) -> None:
    cases: list[tuple[str, str]] = [
        ('{"email": "ada@example.com", ', "not valid JSON"),
        ("not json at all", "not valid JSON"),
        ("", "required"),
        ("   ", "required"),
        ("[]", "JSON object"),
        ('["email", "password"]', "JSON object"),
        ('"ada@example.com"', "JSON object"),
        ("null", "JSON object"),
        ("42", "JSON object"),
    ]
    for raw, detail in cases:
        reply = await api.post(
            "/auth/login",
            data=raw,
            headers={"Content-Type": "application/json"},
            expect=400,
        )
        assert detail in reply.detail, (raw, reply.detail)
    # A well-formed body that fails validation is 422, naming every failing field.
    reply = await api.post("/auth/signup", json={"email": "nope", "password": "short"}, expect=422)
    assert "body.email:" in reply.detail
    assert "body.password:" in reply.detail
    assert "body.name:" in reply.detail


@pytest.fixture
async def bare_client(
    aiohttp_client: ClientFactory, settings: Settings
) -> TestClient[web.Request, web.Application]:
    """The app without the contract checker, whose job is to reject 500s."""
    return await aiohttp_client(create_app(settings))


async def test_unexpected_errors_are_500_and_database_outages_503_without_internals(
    bare_client: TestClient[web.Request, web.Application],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def login() -> tuple[int, dict[str, str], Any]:
        response = await bare_client.post(
            "/api/v1/auth/login", json={"email": "ada@example.com", "password": "password123"}
        )
        return response.status, dict(response.headers), await response.json()

    async def broken(*args: Any) -> None:
        raise RuntimeError("secret internal state")

    monkeypatch.setattr(users_db, "by_email", broken)
    with caplog.at_level(logging.ERROR, logger="gateway.errors"):
        status, _, body = await login()
    assert status == 500
    assert body == {"detail": "internal server error"}
    [record] = [r for r in caplog.records if r.name == "gateway.errors"]
    assert record.exc_info is not None and "secret internal state" in str(record.exc_info[1])

    async def down(*args: Any) -> None:
        raise ConnectionRefusedError("connection refused")

    monkeypatch.setattr(users_db, "by_email", down)
    status, headers, body = await login()
    assert status == 503
    assert headers["Retry-After"] == "1"
    assert set(body) == {"detail"} and "refused" not in body["detail"]
