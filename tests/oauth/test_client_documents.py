"""Client ID metadata documents: an https client_id is fetched (under the outbound address
policy, bounded in size and time, no redirect followed), checked, cached, and then used like a
registered client. A document that is refused makes the authorize endpoint show why."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.config import Settings
from gateway.oauth import clients
from gateway.oauth.clients import DOCUMENT_SSL
from tests.helpers.alerting import add_server
from tests.helpers.api import Api
from tests.helpers.contract import ContractChecker
from tests.helpers.oauth import (
    OAUTH_PUBLIC_URL,
    REDIRECT_URI,
    AuthorizationRequest,
    OAuthHttp,
    mcp_url,
)
from tests.helpers.tls import TestCA


@dataclass
class DocumentServer:
    """An https server on loopback (certificate from a test CA) serving client documents."""

    base: str = ""
    # path -> (status, body, headers, seconds to wait first)
    answers: dict[str, tuple[int, bytes, dict[str, str], float]] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)

    def url(self, name: str) -> str:
        return f"{self.base}/{name}"

    def serve(
        self,
        name: str,
        document: Any = None,
        *,
        status: int = 200,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        wait: float = 0.0,
    ) -> str:
        import orjson

        url = self.url(name)
        if document is None and raw is None:
            document = {
                "client_id": url,
                "client_name": "Doc Client",
                "redirect_uris": [REDIRECT_URI],
            }
        body = raw if raw is not None else orjson.dumps(document)
        self.answers["/" + name] = (status, body, headers or {}, wait)
        return url

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits[request.path] = self.hits.get(request.path, 0) + 1
        status, body, headers, wait = self.answers[request.path]
        if wait:
            await asyncio.sleep(wait)
        return web.Response(
            status=status, body=body, headers=headers, content_type="application/json"
        )


@dataclass
class World:
    api: Api
    http: OAuthHttp
    documents: DocumentServer


GatewayFactory = Callable[..., Awaitable[World]]


@pytest.fixture
async def world(
    settings: Settings,
    aiohttp_client: Callable[..., Awaitable[TestClient[web.Request, web.Application]]],
) -> AsyncIterator[GatewayFactory]:
    ca = TestCA()
    trusting = ca.client_context()
    documents = DocumentServer()
    doc_app = web.Application()
    doc_app.router.add_get("/{name}", documents.handle)
    doc_server = TestServer(doc_app)
    await doc_server.start_server(ssl=ca.server_context())
    documents.base = str(doc_server.make_url("")).rstrip("/")
    checkers: list[ContractChecker] = []

    async def make(**changes: Any) -> World:
        app = create_app(settings.replace(public_url=OAUTH_PUBLIC_URL, **changes))
        app[DOCUMENT_SSL] = trusting
        checker = ContractChecker(app)
        checkers.append(checker)
        app.middlewares.insert(0, checker.middleware)
        client = await aiohttp_client(app)
        http = OAuthHttp(client.session, str(client.make_url("")))
        return World(Api(client), http, documents)

    yield make
    await doc_server.close()
    for checker in checkers:
        checker.assert_clean()


async def _member(world: World) -> tuple[str, str]:
    owner = await world.api.org(await world.api.signup(), name="Docs Inc")
    # Not on loopback: one test refuses loopback addresses.
    server_id = await add_server(world.api, owner, "docs-server", "http://192.0.2.1:9/mcp")
    await world.http.sign_in(owner.email)
    return owner.email, mcp_url(OAUTH_PUBLIC_URL, server_id)


async def test_a_document_client_authorizes_and_gets_tokens(
    world: GatewayFactory, db: asyncpg.Connection
) -> None:
    w = await world()
    _, resource = await _member(w)
    client_id = w.documents.serve("client.json")
    request = AuthorizationRequest(client_id, resource)
    page = await w.http.authorize_page(request)
    assert page.status == 200 and "Doc Client" in page.body, (client_id, page.body[-700:])
    reply = await w.http.decide(page.body)
    code = reply.location.query["code"]
    tokens = await w.http.exchange(request, code)
    assert tokens.status == 200, tokens.body
    refreshed = await w.http.refresh(client_id, tokens.body["refresh_token"])
    assert refreshed.status == 200
    # Fetched once, then cached (in this process and in oauth_clients).
    assert w.documents.hits["/client.json"] == 1
    row = await db.fetchrow("SELECT * FROM oauth_clients WHERE client_id = $1", client_id)
    assert row is not None
    assert not row["registered"] and row["fetched_at"] is not None
    grant = await db.fetchval("SELECT client_name FROM oauth_grants")
    assert grant == "Doc Client"


async def _refused(w: World, client_id: str, resource: str, why: str) -> None:
    reply = await w.http.authorize_page(AuthorizationRequest(client_id, resource))
    assert reply.status == 400, reply.status
    assert "Location" not in reply.headers
    assert why in reply.body, reply.body[-1500:]


async def test_a_document_naming_another_client_id_is_refused(
    world: GatewayFactory, db: asyncpg.Connection
) -> None:
    w = await world()
    _, resource = await _member(w)
    url = w.documents.serve(
        "liar.json",
        {
            "client_id": "https://claude.ai/client.json",
            "client_name": "Claude",
            "redirect_uris": [REDIRECT_URI],
        },
    )
    await _refused(w, url, resource, "another client_id")
    assert await db.fetchval("SELECT count(*) FROM oauth_clients") == 0


async def test_a_document_too_large_is_refused(world: GatewayFactory) -> None:
    w = await world()
    _, resource = await _member(w)
    url = w.documents.url("big.json")
    w.documents.serve(
        "big.json",
        {"client_id": url, "redirect_uris": [REDIRECT_URI], "padding": "x" * 70_000},
    )
    await _refused(w, url, resource, "larger than 64 KiB")


async def test_a_document_too_slow_is_refused(
    world: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clients, "DOCUMENT_SECONDS", 0.5)
    w = await world()
    _, resource = await _member(w)
    url = w.documents.serve("slow.json", wait=30.0)
    await _refused(w, url, resource, "did not arrive within 0.5 seconds")


async def test_a_redirect_is_not_followed(world: GatewayFactory) -> None:
    w = await world()
    _, resource = await _member(w)
    target = w.documents.serve("real.json")
    url = w.documents.serve("moved.json", status=302, raw=b"", headers={"Location": target})
    await _refused(w, url, resource, "answered HTTP 302")
    assert "/real.json" not in w.documents.hits


async def test_bad_documents_are_refused(world: GatewayFactory) -> None:
    w = await world()
    _, resource = await _member(w)
    url = w.documents.url("evil.json")
    w.documents.serve("evil.json", {"client_id": url, "redirect_uris": ["http://evil.example/cb"]})
    await _refused(w, url, resource, "bad redirect URI")
    not_json = w.documents.serve("text.json", raw=b"<html>")
    await _refused(w, not_json, resource, "is not JSON")
    await _refused(w, w.documents.base + "/", resource, "needs a path")


async def test_an_address_refused_by_the_outbound_policy_is_not_fetched(
    world: GatewayFactory,
) -> None:
    w = await world(outbound_deny=(ipaddress.ip_network("127.0.0.0/8"),))
    _, resource = await _member(w)
    url = w.documents.serve("client.json")
    await _refused(w, url, resource, "refused by the outbound policy")
    assert "/client.json" not in w.documents.hits


async def test_a_stale_document_is_fetched_again(
    world: GatewayFactory, db: asyncpg.Connection
) -> None:
    w = await world()
    _, resource = await _member(w)
    url = w.documents.serve("client.json")
    assert (await w.http.authorize_page(AuthorizationRequest(url, resource))).status == 200
    await db.execute("UPDATE oauth_clients SET fetched_at = now() - interval '2 hours'")
    # Another process (no copy in its memory) finds the row stale and fetches the document.
    other = await world()
    await other.http.sign_in(await db.fetchval("SELECT email FROM users LIMIT 1"))
    w.documents.serve(
        "client.json",
        {"client_id": url, "client_name": "Renamed", "redirect_uris": [REDIRECT_URI]},
    )
    page = await other.http.authorize_page(AuthorizationRequest(url, resource))
    assert page.status == 200 and "Renamed" in page.body
    assert w.documents.hits["/client.json"] == 2
