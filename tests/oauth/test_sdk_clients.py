"""The official SDK's OAuth client end to end: refused with a 401, it discovers the protected
resource and the authorization server, registers (or names its client ID metadata document),
a person signs in and consents in Chromium, and it lists and calls tools through the proxy and
through a toolset, in both protocol eras; the call log names the client.

The gateway runs on a real port of 127.0.0.1 with PUBLIC_URL its own address (loopback, where
OAuth over http is allowed), since the SDK client speaks real HTTP; each client's redirect URI
is a loopback server of the test's own (RFC 8252).
"""

from __future__ import annotations

import contextlib
import html
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx2
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from mcp.client import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientMetadata

from gateway.app import create_app
from gateway.config import Settings
from gateway.oauth.clients import DOCUMENT_SSL
from tests.helpers.api import Account, Api
from tests.helpers.chromium import launched, needs_chromium, playwright_api
from tests.helpers.contract import ContractChecker
from tests.helpers.oauth import AuthorizationRequest, OAuthHttp
from tests.helpers.oauth_browser import (
    Consent,
    LoopbackRedirect,
    MemoryStorage,
    Redirected,
    loopback_redirect,
)
from tests.helpers.proxying import add_server, logged_calls
from tests.helpers.tls import TestCA, serve_https
from tests.helpers.toolsets import prefix
from tests.helpers.upstreams import free_port, serve_loopback

pytestmark = needs_chromium

ERA = {"legacy": "2025-11-25", "auto": "2026-07-28"}


# -- the arrangement ---------------------------------------------------------------------------


@pytest.fixture
async def chromium() -> AsyncIterator[Any]:
    async with launched() as browser:
        yield browser


@pytest.fixture
def ca() -> TestCA:
    return TestCA()


@pytest.fixture
async def gateway(settings: Settings, aiohttp_client: Any, ca: TestCA) -> AsyncIterator[Api]:
    """The app on a real port of 127.0.0.1, PUBLIC_URL its own address, trusting the test CA
    (only) for the client ID metadata documents it fetches."""
    port = free_port()
    app = create_app(settings.replace(public_url=f"http://127.0.0.1:{port}"))
    app[DOCUMENT_SSL] = ca.client_context()
    checker = ContractChecker(app)
    app.middlewares.insert(0, checker.middleware)
    client: TestClient[web.Request, web.Application] = await aiohttp_client(
        app, server_kwargs={"host": "127.0.0.1", "port": port}
    )
    yield Api(client)
    checker.assert_clean()


@pytest.fixture
async def redirect() -> AsyncIterator[LoopbackRedirect]:
    async with loopback_redirect() as loopback:
        yield loopback


async def workspace_with_a_server(gateway: Api, db: asyncpg.Connection, url: str) -> Any:
    """An owner signed up, in an org workspace "Acme Research" holding a server at `url`."""
    owner = await gateway.org(await gateway.signup(), "Acme Research")
    server_id = await add_server(gateway, db, owner, url)
    name = await db.fetchval("SELECT name FROM servers WHERE id = $1", uuid.UUID(server_id))
    return owner, server_id, name


async def toolset_of(db: asyncpg.Connection, owner: Account, servers: list[str]) -> str:
    toolset_id = await db.fetchval(
        "INSERT INTO toolsets (workspace_id, name) VALUES ($1, 'research tools') RETURNING id",
        uuid.UUID(owner.workspace_id),
    )
    for position, server_id in enumerate(servers):
        await db.execute(
            "INSERT INTO toolset_servers (toolset_id, server_id, position) VALUES ($1, $2, $3)",
            toolset_id,
            uuid.UUID(server_id),
            position,
        )
    return str(toolset_id)


def mcp_url(gateway: Api, path: str) -> str:
    return str(gateway.client.make_url(path))


def oauth_provider(
    url: str, consent: Consent, *, name: str, client_metadata_url: str | None = None
) -> OAuthClientProvider:
    """The SDK's OAuth client for the MCP URL: it registers as `name` (or names its client ID
    metadata document) and asks `consent` to take the person through the authorization. One
    provider is one client: what it discovered and the tokens it holds last across connections."""
    metadata = OAuthClientMetadata(client_name=name, redirect_uris=[consent.redirect.redirect_uri])
    return OAuthClientProvider(
        url,
        metadata,
        MemoryStorage(),
        consent.redirect_handler,
        consent.callback_handler,
        client_metadata_url=client_metadata_url,
    )


@contextlib.asynccontextmanager
async def connected(url: str, provider: OAuthClientProvider, mode: str) -> AsyncIterator[Client]:
    """The SDK client over streamable HTTP, authorized by `provider`."""
    async with (
        httpx2.AsyncClient(auth=provider, timeout=20) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        yield client


def oauth_client(
    url: str,
    consent: Consent,
    mode: str,
    *,
    name: str,
    client_metadata_url: str | None = None,
) -> contextlib.AbstractAsyncContextManager[Client]:
    """A new client, connected (the person is asked as soon as it is refused)."""
    provider = oauth_provider(url, consent, name=name, client_metadata_url=client_metadata_url)
    return connected(url, provider, mode)


# -- through the proxy and through a toolset ---------------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_sdk_client_registers_a_person_consents_and_it_calls_through_the_proxy(
    gateway: Api,
    db: asyncpg.Connection,
    chromium: Any,
    redirect: LoopbackRedirect,
    sdk_stateful: str,
    mode: str,
) -> None:
    owner, server_id, server_name = await workspace_with_a_server(gateway, db, sdk_stateful)
    url = mcp_url(gateway, f"/api/v1/proxy/{server_id}/mcp")
    consent = Consent(chromium, redirect, owner.email, photograph=f"oauth-consent-proxy-{mode}")
    async with oauth_client(url, consent, mode, name="Research agent") as client:
        assert client.protocol_version == ERA[mode]
        tools = await client.list_tools()
        added = await client.call_tool("add", {"a": 2, "b": 40})
    assert "add" in {tool.name for tool in tools.tools}
    assert added.structured_content == {"result": 42}
    # One sign-in, one consent page naming the client, the server and its workspace.
    assert (consent.signed_in, len(consent.pages), consent.problems) == (1, 1, [])
    for shown in ("Research agent", server_name, "Acme Research", "127.0.0.1"):
        assert shown in consent.pages[0], (shown, consent.pages[0])
    [row] = await logged_calls(db, 1)
    assert row["caller_agent"] == "Research agent"
    assert (str(row["server_id"]), str(row["workspace_id"])) == (server_id, owner.workspace_id)
    [grant] = await db.fetch("SELECT * FROM oauth_grants")
    assert (grant["resource"], str(grant["server_id"])) == (url, server_id)
    assert str(grant["user_id"]) == owner.user_id
    assert await db.fetchval("SELECT registered FROM oauth_clients") is True


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_sdk_client_registers_a_person_consents_and_it_calls_through_a_toolset(
    gateway: Api,
    db: asyncpg.Connection,
    chromium: Any,
    redirect: LoopbackRedirect,
    sdk_stateful: str,
    sdk_stateless: str,
    mode: str,
) -> None:
    owner, first, first_name = await workspace_with_a_server(gateway, db, sdk_stateful)
    second = await add_server(gateway, db, owner, sdk_stateless)
    toolset_id = await toolset_of(db, owner, [first, second])
    url = mcp_url(gateway, f"/api/v1/toolsets/{toolset_id}/mcp")
    consent = Consent(chromium, redirect, owner.email, photograph=f"oauth-consent-toolset-{mode}")
    async with oauth_client(url, consent, mode, name="Toolset agent") as client:
        assert client.protocol_version == ERA[mode]
        tools = await client.list_tools()
        added = await client.call_tool(f"{prefix(first_name)}add", {"a": 1, "b": 2})
    assert f"{prefix(first_name)}add" in {tool.name for tool in tools.tools}
    assert added.structured_content == {"result": 3}
    assert (len(consent.pages), consent.problems) == (1, [])
    for shown in ("Toolset agent", "research tools", "Acme Research"):
        assert shown in consent.pages[0], (shown, consent.pages[0])
    [row] = await logged_calls(db, 1)
    assert row["caller_agent"] == "Toolset agent"
    assert (str(row["toolset_id"]), str(row["server_id"])) == (toolset_id, first)
    [grant] = await db.fetch("SELECT * FROM oauth_grants")
    assert (grant["resource"], str(grant["toolset_id"])) == (url, toolset_id)


# -- a client ID metadata document -------------------------------------------------------------


@contextlib.asynccontextmanager
async def client_document(ca: TestCA, document: dict[str, Any]) -> AsyncIterator[Any]:
    """Serve `document` over https on loopback at /oauth/client.json, with `client_id` its own
    URL; yields (that URL, the list of requests that fetched it)."""
    fetched: list[str] = []

    async def serve(request: web.Request) -> web.Response:
        fetched.append(request.headers.get("Accept", ""))
        return web.json_response(document)

    app = web.Application()
    app.router.add_get("/oauth/client.json", serve)
    async with serve_https(app, ca) as base_url:
        document["client_id"] = f"{base_url}/oauth/client.json"
        yield document["client_id"], fetched


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_client_known_by_its_metadata_document_connects_without_registering(
    gateway: Api,
    db: asyncpg.Connection,
    chromium: Any,
    redirect: LoopbackRedirect,
    ca: TestCA,
    sdk_stateful: str,
    mode: str,
) -> None:
    owner, server_id, _ = await workspace_with_a_server(gateway, db, sdk_stateful)
    url = mcp_url(gateway, f"/api/v1/proxy/{server_id}/mcp")
    document = {
        "client_name": "Documented agent",
        "redirect_uris": [redirect.redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }
    consent = Consent(chromium, redirect, owner.email)
    async with (
        client_document(ca, document) as (client_id, fetched),
        oauth_client(
            url, consent, mode, name="not this name", client_metadata_url=client_id
        ) as client,
    ):
        added = await client.call_tool("add", {"a": 20, "b": 22})
    assert added.structured_content == {"result": 42}
    assert fetched, "the gateway never fetched the client's document"
    assert "Documented agent" in consent.pages[0]
    assert consent.problems == []
    [client_row] = await db.fetch("SELECT * FROM oauth_clients")
    assert (client_row["client_id"], client_row["registered"]) == (client_id, False)
    [row] = await logged_calls(db, 1)
    assert row["caller_agent"] == "Documented agent"


# -- what a client keeps between connections ---------------------------------------------------


async def test_a_client_reconnects_and_refreshes_without_the_person_until_its_grant_ends(
    gateway: Api,
    db: asyncpg.Connection,
    chromium: Any,
    redirect: LoopbackRedirect,
    sdk_stateless: str,
) -> None:
    owner, server_id, _ = await workspace_with_a_server(gateway, db, sdk_stateless)
    url = mcp_url(gateway, f"/api/v1/proxy/{server_id}/mcp")
    consent = Consent(chromium, redirect, owner.email)
    provider = oauth_provider(url, consent, name="Keeper")
    async with connected(url, provider, "auto") as client:
        await client.call_tool("add", {"a": 1, "b": 1})
    tokens = provider.context.current_tokens
    assert tokens is not None and tokens.refresh_token
    first_refresh = tokens.refresh_token
    # Connecting again, the access token it holds asks nobody.
    async with connected(url, provider, "auto") as client:
        await client.call_tool("add", {"a": 2, "b": 2})
    # An hour later its access token has expired: it refreshes, and the refresh token rotates.
    provider.context.token_expiry_time = time.time() - 1
    async with connected(url, provider, "auto") as client:
        again = await client.call_tool("add", {"a": 3, "b": 3})
    assert again.structured_content == {"result": 6}
    tokens = provider.context.current_tokens
    assert tokens is not None and tokens.refresh_token not in (None, first_refresh)
    assert (len(consent.pages), consent.problems) == (1, [])
    rows = await logged_calls(db, 3)
    assert {row["caller_agent"] for row in rows} == {"Keeper"}
    # Someone who copied the first refresh token presents it: refused, and the grant ends, so
    # the client's own tokens stop working at once and the person is asked again.
    assert provider.context.client_info is not None
    async with httpx2.AsyncClient() as http:
        stolen = await http.post(
            str(gateway.client.make_url("/oauth/token")),
            data={
                "grant_type": "refresh_token",
                "refresh_token": first_refresh,
                "client_id": provider.context.client_info.client_id,
            },
        )
    assert (stolen.status_code, stolen.json()["error"]) == (400, "invalid_grant")
    assert await db.fetchval("SELECT count(*) FROM oauth_grants") == 0
    async with connected(url, provider, "auto") as client:
        await client.call_tool("add", {"a": 4, "b": 4})
    assert len(consent.pages) == 2


async def test_deny_in_the_browser_gives_the_client_access_denied_and_no_grant(
    gateway: Api,
    db: asyncpg.Connection,
    chromium: Any,
    redirect: LoopbackRedirect,
    sdk_stateless: str,
) -> None:
    owner, server_id, _ = await workspace_with_a_server(gateway, db, sdk_stateless)
    url = mcp_url(gateway, f"/api/v1/proxy/{server_id}/mcp")
    consent = Consent(chromium, redirect, owner.email, answer="Deny")
    with pytest.raises(BaseException) as raised:
        async with oauth_client(url, consent, "auto", name="Refused agent") as client:
            await client.list_tools()
    denied = _find(raised.value, Redirected)
    assert denied is not None, raised.value
    assert denied.query["error"] == "access_denied"
    # RFC 9207: an error response names the issuer too.
    assert denied.query["iss"] == str(gateway.client.make_url("")).rstrip("/")
    assert await db.fetchval("SELECT count(*) FROM oauth_grants") == 0
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 0


def _find(error: BaseException, kind: type[Redirected]) -> Redirected | None:
    """The exception of `kind` inside `error` (through groups, causes and contexts)."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kind):
            return current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


async def test_a_hostile_client_name_is_text_on_the_consent_page_and_in_the_log(
    gateway: Api,
    db: asyncpg.Connection,
    chromium: Any,
    redirect: LoopbackRedirect,
    sdk_stateless: str,
) -> None:
    owner, server_id, _ = await workspace_with_a_server(gateway, db, sdk_stateless)
    url = mcp_url(gateway, f"/api/v1/proxy/{server_id}/mcp")
    hostile = '<img src=x onerror="alert(1)"><script>alert(2)</script>&amp; "Claude"'
    consent = Consent(chromium, redirect, owner.email, photograph="oauth-consent-hostile-name")
    async with oauth_client(url, consent, "auto", name=hostile) as client:
        await client.call_tool("add", {"a": 1, "b": 1})
    # Shown as the very characters registered (escaped, never markup), and nothing ran.
    assert hostile in consent.pages[0]
    assert consent.problems == []
    [row] = await logged_calls(db, 1)
    assert row["caller_agent"] == hostile


# -- the person's browser ----------------------------------------------------------------------


async def test_a_signed_out_person_is_sent_to_no_client_by_a_bad_request(
    gateway: Api,
    db: asyncpg.Connection,
    chromium: Any,
    redirect: LoopbackRedirect,
    sdk_stateless: str,
) -> None:
    """RFC 9700 4.11.2: anyone may register a client, and so a redirect URI; a link to an
    authorization request that is bad for any other reason must not send a person who has
    not signed in there. They see why instead."""
    _, server_id, _ = await workspace_with_a_server(gateway, db, sdk_stateless)
    http = OAuthHttp(gateway.client.session, str(gateway.client.make_url("")))
    client_id = await http.client_id(name="Phisher", redirect_uris=[redirect.redirect_uri])
    bad = AuthorizationRequest(
        client_id,
        mcp_url(gateway, f"/api/v1/proxy/{server_id}/mcp"),
        redirect_uri=redirect.redirect_uri,
        extra={"code_challenge_method": "plain"},
    )
    context = await chromium.new_context()
    try:
        page = await context.new_page()
        url = gateway.client.make_url("/oauth/authorize").with_query(bad.query())
        response = await page.goto(str(url))
        assert response is not None and response.status == 400
        await playwright_api.expect(page.get_by_text("cannot be served")).to_be_visible()
        assert page.url.startswith(str(gateway.client.make_url("")))
    finally:
        await context.close()
    assert redirect.responses.empty()


async def test_the_consent_page_cannot_be_framed_by_another_page(
    gateway: Api,
    db: asyncpg.Connection,
    chromium: Any,
    redirect: LoopbackRedirect,
    sdk_stateless: str,
) -> None:
    """RFC 9700 4.16: a page of another origin (on the same site, so the dashboard's cookies
    go with the frame's request) frames the consent page of a signed-in person: Chromium
    refuses to show it."""
    owner, server_id, _ = await workspace_with_a_server(gateway, db, sdk_stateless)
    http = OAuthHttp(gateway.client.session, str(gateway.client.make_url("")))
    client_id = await http.client_id(name="Framer", redirect_uris=[redirect.redirect_uri])
    request = AuthorizationRequest(
        client_id,
        mcp_url(gateway, f"/api/v1/proxy/{server_id}/mcp"),
        redirect_uri=redirect.redirect_uri,
    )
    authorize = str(gateway.client.make_url("/oauth/authorize").with_query(request.query()))

    async def framing(_: web.Request) -> web.Response:
        return web.Response(
            text=f'<!doctype html><iframe src="{html.escape(authorize)}"></iframe>',
            content_type="text/html",
        )

    attacker = web.Application()
    attacker.router.add_get("/", framing)
    context = await chromium.new_context()
    try:
        page = await context.new_page()
        await page.goto(authorize)
        await page.get_by_label("Email").fill(owner.email)
        await page.get_by_label("Password").fill("password123")
        await page.get_by_role("button", name="Log in").click()
        allow = page.get_by_role("button", name="Allow", exact=True)
        await playwright_api.expect(allow).to_be_visible()  # framed, this is what it would show
        shown = await page.goto(authorize)
        assert shown is not None and shown.status == 200
        headers = await shown.all_headers()
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"
        # RFC 9700 4.2: the authorization request's URL is never another origin's Referer.
        assert headers["referrer-policy"] in ("same-origin", "no-referrer")
        assert headers["cache-control"] == "no-store"
        async with serve_loopback(attacker) as attacker_url:
            # Chromium says so on the console once it refused the frame's answer.
            refused = page.expect_console_message(
                lambda m: "frame-ancestors" in m.text, timeout=10_000
            )
            async with refused:
                await page.goto(attacker_url)
            frame = page.frame_locator("iframe")
            assert await frame.get_by_role("button", name="Allow", exact=True).count() == 0
    finally:
        await context.close()
    assert redirect.responses.empty()
