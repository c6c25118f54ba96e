"""The MCP URLs as OAuth protected resources: a token works on the one URL it was issued for
(proxy and toolset, against real upstreams) and nowhere else, acts as its member until they
leave or the grant is revoked, names its client in the call log, and every 401 of an MCP URL
points the client to the URL's metadata (RFC 9728)."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.accounts.access import AUTHENTICATOR
from gateway.background import last_used
from gateway.caching.caches import MISSING
from gateway.keys import POOL
from gateway.security.tokens import OAuthClaims, issue_oauth_token
from tests.helpers.api import Account, Api, AppFactory, Reply
from tests.helpers.oauth_grants import OAUTH_PUBLIC_URL, grant, proxy_path, toolset_path
from tests.helpers.proxying import ACCEPT, add_server, call, logged_calls, recorder, rpc
from tests.helpers.toolsets import arrange_toolset, prefix
from tests.helpers.waiting import until

METADATA = f"{OAUTH_PUBLIC_URL}/.well-known/oauth-protected-resource"


@pytest.fixture
async def api(make_api: AppFactory) -> Api:
    """A gateway that offers OAuth: its PUBLIC_URL is https."""
    return await make_api(public_url=OAUTH_PUBLIC_URL)


def challenge(path: str, *, invalid: bool) -> str:
    error = 'error="invalid_token", ' if invalid else ""
    return f'Bearer {error}resource_metadata="{METADATA}{path}"'


async def mcp_post(api: Api, path: str, headers: dict[str, str], message: Any = None) -> Reply:
    """A POST to an MCP URL (its full path, as the token names it)."""
    body = message if message is not None else rpc("initialize", {})
    return await api.post(path, json=body, headers={"Accept": ACCEPT, **headers})


def sdk(url: str, headers: dict[str, str], mode: str = "auto") -> tuple[httpx2.AsyncClient, Client]:
    http = httpx2.AsyncClient(headers=headers, timeout=30)
    return http, Client(streamable_http_client(url, http_client=http), mode=mode)


async def workspace_with_server(api: Api, db: asyncpg.Connection, url: str) -> tuple[Account, str]:
    owner = await api.signup()
    return owner, await add_server(api, db, owner, url)


# -- a token works on its MCP URL ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_token_works_on_its_servers_mcp_url_through_the_proxy(
    api: Api, db: asyncpg.Connection, sdk_stateful: str, mode: str
) -> None:
    owner, server_id = await workspace_with_server(api, db, sdk_stateful)
    path = proxy_path(server_id)
    granted = await grant(api, owner, path, "Claude")
    http, client = sdk(str(api.client.make_url(path)), granted.headers, mode)
    async with http, client:
        tools = await client.list_tools()
        added = await client.call_tool("add", {"a": 2, "b": 40})
    assert "add" in {tool.name for tool in tools.tools}
    assert added.structured_content == {"result": 42}
    [row] = await logged_calls(db, 1)
    assert (row["tool_name"], row["status"]) == ("add", "success")
    assert str(row["server_id"]) == server_id
    # The call acts as the member who consented, in their workspace, and names the client.
    assert str(row["workspace_id"]) == owner.workspace_id
    assert row["caller_agent"] == "Claude"


async def test_a_token_works_on_its_toolsets_mcp_url(
    api: Api, db: asyncpg.Connection, sdk_stateful: str, sdk_stateless: str
) -> None:
    toolset = await arrange_toolset(api, db, [sdk_stateful, sdk_stateless])
    granted = await grant(api, toolset.owner, toolset_path(toolset.toolset_id), "ChatGPT")
    http, client = sdk(toolset.url, granted.headers)
    add = f"{prefix(toolset.names[1])}add"
    async with http, client:
        tools = await client.list_tools()
        added = await client.call_tool(add, {"a": 20, "b": 22})
    assert add in {tool.name for tool in tools.tools}
    assert added.structured_content == {"result": 42}
    [row] = await logged_calls(db, 1)
    assert (row["tool_name"], str(row["server_id"])) == ("add", toolset.servers[1])
    assert str(row["toolset_id"]) == toolset.toolset_id
    assert row["caller_agent"] == "ChatGPT"


async def test_a_token_is_good_for_every_method_of_its_mcp_url(
    api: Api, db: asyncpg.Connection
) -> None:
    async with recorder() as upstream:
        owner, server_id = await workspace_with_server(api, db, upstream.url)
        granted = await grant(api, owner, proxy_path(server_id))
        for method in ("GET", "DELETE"):
            reply = await api.request(method, granted.path, headers=granted.headers)
            # Forwarded: the upstream's own answer (it takes POST only).
            assert reply.status == 405, (method, reply.body)
    assert [method for method, _, _ in upstream.requests] == ["GET", "DELETE"]
    # The gateway's credentials for the server go upstream, never the caller's token.
    assert all(granted.token not in str(headers) for _, headers, _ in upstream.requests)


async def test_api_keys_and_the_apis_access_tokens_keep_working_beside_oauth(
    api: Api, db: asyncpg.Connection
) -> None:
    async with recorder() as upstream:
        owner, server_id = await workspace_with_server(api, db, upstream.url)
        key = await api.api_key(owner)
        for headers in (owner.headers, {"X-API-Key": key}, {"Authorization": f"Bearer {key}"}):
            reply = await mcp_post(api, proxy_path(server_id), headers)
            assert reply.status == 200, headers


# -- and nowhere else ------------------------------------------------------------------------


async def test_a_token_is_refused_on_another_servers_mcp_url(
    api: Api, db: asyncpg.Connection
) -> None:
    owner, server_id = await workspace_with_server(api, db, "http://127.0.0.1:9/mcp")
    other = await add_server(api, db, owner, "http://127.0.0.1:9/other")
    granted = await grant(api, owner, proxy_path(server_id))
    reply = await mcp_post(api, proxy_path(other), granted.headers)
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"] == challenge(proxy_path(other), invalid=True)
    assert reply.detail.startswith("this OAuth access token is for another resource: ")


async def test_a_token_is_refused_on_another_toolset_and_on_its_servers_own_url(
    api: Api, db: asyncpg.Connection
) -> None:
    toolset = await arrange_toolset(api, db, ["http://127.0.0.1:9/mcp"])
    other = await db.fetchval(
        "INSERT INTO toolsets (workspace_id, name) VALUES ($1, 'other') RETURNING id",
        uuid.UUID(toolset.owner.workspace_id),
    )
    granted = await grant(api, toolset.owner, toolset_path(toolset.toolset_id))
    for path in (toolset_path(str(other)), proxy_path(toolset.servers[0])):
        reply = await mcp_post(api, path, granted.headers)
        assert reply.status == 401, path
        assert reply.headers["WWW-Authenticate"] == challenge(path, invalid=True)


async def test_a_token_is_refused_by_the_rest_api(api: Api, db: asyncpg.Connection) -> None:
    owner, server_id = await workspace_with_server(api, db, "http://127.0.0.1:9/mcp")
    granted = await grant(api, owner, proxy_path(server_id))
    for path in ("/servers", f"/servers/{server_id}", "/auth/me", "/tool-calls"):
        reply = await api.get(path, headers=granted.headers, expect=401)
        assert reply.detail == "an OAuth access token is good only on the MCP URL it was issued for"
        # The REST API is no protected resource: its 401 stays as it was.
        assert "WWW-Authenticate" not in reply.headers
    await api.get("/servers", auth=owner, expect=200)


async def test_an_expired_token_is_refused_as_an_invalid_token(
    api: Api, db: asyncpg.Connection
) -> None:
    owner, server_id = await workspace_with_server(api, db, "http://127.0.0.1:9/mcp")
    path = proxy_path(server_id)
    granted = await grant(api, owner, path, ttl_seconds=-60)
    reply = await mcp_post(api, path, granted.headers)
    assert reply.status == 401
    assert reply.detail.startswith("OAuth access token expired: ")
    assert reply.headers["WWW-Authenticate"] == challenge(path, invalid=True)


async def test_a_token_signed_with_another_secret_is_refused(
    api: Api, db: asyncpg.Connection
) -> None:
    owner, server_id = await workspace_with_server(api, db, "http://127.0.0.1:9/mcp")
    path = proxy_path(server_id)
    granted = await grant(api, owner, path)
    claims = OAuthClaims(
        granted.grant_id, uuid.UUID(owner.user_id), uuid.UUID(owner.workspace_id), granted.resource
    )
    forged = issue_oauth_token("another-secret-" + "y" * 40, 3600, claims, OAUTH_PUBLIC_URL)
    reply = await mcp_post(api, path, {"Authorization": f"Bearer {forged}"})
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"] == challenge(path, invalid=True)


# -- the 401 of an MCP URL -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["proxy", "toolset"])
async def test_an_unauthenticated_mcp_request_is_pointed_to_the_urls_metadata(
    api: Api, db: asyncpg.Connection, kind: str
) -> None:
    toolset = await arrange_toolset(api, db, ["http://127.0.0.1:9/mcp"])
    path = proxy_path(toolset.servers[0]) if kind == "proxy" else toolset_path(toolset.toolset_id)
    reply = await mcp_post(api, path, {})
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"] == challenge(path, invalid=False)
    # The detail says both ways in.
    assert reply.detail.startswith("authentication required: connect with OAuth")
    assert "X-API-Key: mcpg_" in reply.detail


async def test_a_refused_api_key_on_an_mcp_url_is_an_invalid_token_too(
    api: Api, db: asyncpg.Connection
) -> None:
    _, server_id = await workspace_with_server(api, db, "http://127.0.0.1:9/mcp")
    path = proxy_path(server_id)
    for headers in (
        {"X-API-Key": "mcpg_" + "x" * 43},
        {"Authorization": "Bearer mcpg_" + "x" * 43},
        {"Authorization": "Bearer not-a-token"},
    ):
        reply = await mcp_post(api, path, headers)
        assert reply.status == 401, headers
        assert reply.headers["WWW-Authenticate"] == challenge(path, invalid=True)


async def test_a_revoked_api_key_known_to_the_cache_gets_the_challenge_too(
    api: Api, db: asyncpg.Connection
) -> None:
    _, server_id = await workspace_with_server(api, db, "http://127.0.0.1:9/mcp")
    path = proxy_path(server_id)
    unknown = {"X-API-Key": "mcpg_" + "z" * 43}
    await mcp_post(api, path, unknown)  # now cached as unknown: the hot path refuses it
    authenticator = api.app[AUTHENTICATOR]
    assert any(value is None for value, _ in authenticator.keys._data.values())
    reply = await mcp_post(api, path, unknown)
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"] == challenge(path, invalid=True)


async def test_the_rest_apis_401_is_unchanged(api: Api) -> None:
    reply = await api.get("/servers", expect=401)
    assert reply.detail == (
        "authentication required: send 'Authorization: Bearer <access token>' "
        "or an API key as 'X-API-Key'"
    )
    assert "WWW-Authenticate" not in reply.headers


async def test_a_browser_client_may_read_the_challenge(api: Api, db: asyncpg.Connection) -> None:
    _, server_id = await workspace_with_server(api, db, "http://127.0.0.1:9/mcp")
    path = proxy_path(server_id)
    reply = await mcp_post(api, path, {"Origin": "https://claude.ai"})
    assert reply.status == 401
    assert reply.headers["Access-Control-Allow-Origin"] == "*"
    exposed = {h.strip().lower() for h in reply.headers["Access-Control-Expose-Headers"].split(",")}
    assert "www-authenticate" in exposed
    assert reply.headers["WWW-Authenticate"] == challenge(path, invalid=False)


async def test_without_oauth_tokens_are_refused_and_the_401_stays_bare(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    """A plain-http PUBLIC_URL (not loopback): the gateway offers no OAuth."""
    plain = await make_api(public_url="http://gateway.test")
    owner, server_id = await workspace_with_server(plain, db, "http://127.0.0.1:9/mcp")
    path = proxy_path(server_id)
    granted = await grant(plain, owner, path)
    for headers in ({}, granted.headers):
        reply = await mcp_post(plain, path, headers)
        assert reply.status == 401
        assert reply.headers["WWW-Authenticate"] == "Bearer"
        assert "OAuth" not in reply.detail


# -- it acts as its member, while the grant stands -----------------------------------------


async def member_with_grant(
    api: Api, db: asyncpg.Connection, url: str
) -> tuple[Account, Account, str, Any]:
    owner = await api.org(await api.signup(), name="Team")
    member = await api.member(owner)
    server_id = await add_server(api, db, owner, url)
    granted = await grant(api, member, proxy_path(server_id), "Claude")
    return owner, member, server_id, granted


async def test_the_member_leaving_the_workspace_ends_the_token_at_once(
    api: Api, db: asyncpg.Connection
) -> None:
    async with recorder() as upstream:
        owner, member, _, granted = await member_with_grant(api, db, upstream.url)
        ok = await mcp_post(api, granted.path, granted.headers, call("echo", text="hi"))
        assert ok.status == 200
        await api.delete(
            f"/workspaces/{owner.workspace_id}/members/{member.user_id}", auth=owner, expect=204
        )
        reply = await mcp_post(api, granted.path, granted.headers, call("echo", text="again"))
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"] == challenge(granted.path, invalid=True)
    assert len(upstream.requests) == 1
    # And the grant went with the membership.
    assert await db.fetchval("SELECT count(*) FROM oauth_grants") == 0


async def test_the_grant_deleted_ends_the_token_once_its_notify_arrives(
    api: Api, db: asyncpg.Connection
) -> None:
    async with recorder() as upstream:
        _, _, _, granted = await member_with_grant(api, db, upstream.url)
        assert (await mcp_post(api, granted.path, granted.headers)).status == 200
        grants = api.app[AUTHENTICATOR].grants
        assert grants.cache.peek(granted.grant_id) is not MISSING
        # Deleted by anything at all (here by hand): the trigger's NOTIFY drops it.
        await db.execute("DELETE FROM oauth_grants WHERE id = $1", granted.grant_id)
        await until(lambda: grants.cache.peek(granted.grant_id) is MISSING)
        reply = await mcp_post(api, granted.path, granted.headers)
    assert reply.status == 401
    assert reply.detail.startswith("this app's access was revoked: connect it again")
    assert reply.headers["WWW-Authenticate"] == challenge(granted.path, invalid=True)


async def test_a_warm_token_costs_no_database_round_trip(api: Api, db: asyncpg.Connection) -> None:
    async with recorder() as upstream:
        _, _, _, granted = await member_with_grant(api, db, upstream.url)
        authenticator = api.app[AUTHENTICATOR]
        assert (await mcp_post(api, granted.path, granted.headers)).status == 200
        grant_loads, role_loads = authenticator.grants.cache.misses, authenticator.roles.misses
        for _ in range(3):
            assert (await mcp_post(api, granted.path, granted.headers)).status == 200
    assert authenticator.grants.cache.misses == grant_loads
    assert authenticator.roles.misses == role_loads


# -- the call log names the client -------------------------------------------------------------


async def test_calls_are_logged_with_the_clients_name_unless_x_caller_agent_is_sent(
    api: Api, db: asyncpg.Connection
) -> None:
    async with recorder() as upstream:
        owner, server_id = await workspace_with_server(api, db, upstream.url)
        granted = await grant(api, owner, proxy_path(server_id), "Claude for <Work>")
        await mcp_post(api, granted.path, granted.headers, call("first"))
        named = {**granted.headers, "X-Caller-Agent": "my-own-agent"}
        await mcp_post(api, granted.path, named, call("second"))
        key = await api.api_key(owner)
        await mcp_post(api, granted.path, {"X-API-Key": key}, call("third"))
    rows = await logged_calls(db, 3)
    by_tool = {row["tool_name"]: row["caller_agent"] for row in rows}
    assert by_tool == {"first": "Claude for <Work>", "second": "my-own-agent", "third": None}


async def test_a_long_client_name_is_cut_as_the_header_is(api: Api, db: asyncpg.Connection) -> None:
    async with recorder() as upstream:
        owner, server_id = await workspace_with_server(api, db, upstream.url)
        granted = await grant(api, owner, proxy_path(server_id), "C" * 400)
        await mcp_post(api, granted.path, granted.headers, call("echo"))
    [row] = await logged_calls(db, 1)
    assert row["caller_agent"] == "C" * 255


async def test_on_a_toolset_x_caller_agent_wins_too(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    toolset = await arrange_toolset(api, db, [sdk_stateless])
    granted = await grant(api, toolset.owner, toolset_path(toolset.toolset_id), "Cursor")
    http, client = sdk(toolset.url, {**granted.headers, "X-Caller-Agent": "nightly-job"})
    async with http, client:
        await client.call_tool(f"{prefix(toolset.names[0])}add", {"a": 1, "b": 2})
    [row] = await logged_calls(db, 1)
    assert (row["tool_name"], row["caller_agent"]) == ("add", "nightly-job")


# -- last used, in batches ---------------------------------------------------------------------


async def test_last_use_is_recorded_in_batches_not_per_call(
    api: Api, db: asyncpg.Connection
) -> None:
    async with recorder() as upstream:
        owner, server_id = await workspace_with_server(api, db, upstream.url)
        granted = await grant(api, owner, proxy_path(server_id))
        for _ in range(2):
            assert (await mcp_post(api, granted.path, granted.headers)).status == 200
    query = "SELECT last_used_at FROM oauth_grants WHERE id = $1"
    assert await db.fetchval(query, granted.grant_id) is None
    grants = api.app[AUTHENTICATOR].grants
    assert set(grants.usage) == {granted.grant_id}
    await last_used.flush(api.app[POOL], last_used.recorded(api.app))
    assert await db.fetchval(query, granted.grant_id) is not None
    assert grants.usage == {}
