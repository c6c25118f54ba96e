"""POST /oauth/token: codes exchanged once with their PKCE verifier, for the client, redirect
URI and resource they were issued for; refresh tokens rotated, a reused one ending its grant."""

from __future__ import annotations

import asyncio

import asyncpg

from gateway.security.tokens import read_oauth_token
from tests.helpers.api import Api, AppFactory
from tests.helpers.oauth import OAUTH_PUBLIC_URL, AuthorizationRequest, OAuthHttp, mcp_url, pkce
from tests.oauth.conftest import Member

SECRET = "test-secret-" + "x" * 40


async def _code(http: OAuthHttp, member: Member, **kw: object) -> tuple[AuthorizationRequest, str]:
    client_id = await http.client_id()
    await http.sign_in(member.account.email)
    request = AuthorizationRequest(client_id, member.resource, **kw)  # type: ignore[arg-type]
    return request, await http.code_for(request)


async def _grants(db: asyncpg.Connection) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM oauth_grants")
    return count


async def test_a_code_becomes_tokens_for_its_resource_as_its_member(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    request, code = await _code(http, member)
    reply = await http.exchange(request, code)
    assert reply.status == 200, reply.body
    assert reply.headers["Cache-Control"] == "no-store"
    tokens = reply.body
    assert tokens["token_type"] == "Bearer" and tokens["expires_in"] == 3600
    assert tokens["refresh_token"] and "scope" in tokens
    claims = read_oauth_token(SECRET, tokens["access_token"], member.resource)
    assert str(claims.user_id) == member.account.user_id
    assert str(claims.workspace_id) == member.account.workspace_id
    grant = await db.fetchrow("SELECT * FROM oauth_grants WHERE id = $1", claims.grant_id)
    assert grant is not None
    assert grant["client_name"] == "Test client" and grant["resource"] == member.resource
    assert str(grant["server_id"]) == member.server_id and grant["toolset_id"] is None
    # Only hashes are kept.
    stored = await db.fetchval("SELECT token_hash FROM oauth_refresh_tokens")
    assert stored != tokens["refresh_token"]
    assert await db.fetchval("SELECT count(*) FROM oauth_codes WHERE code_hash = $1", code) == 0


async def test_a_wrong_verifier_is_invalid_grant(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    request, code = await _code(http, member)
    other, _ = pkce()
    reply = await http.exchange(request, code, code_verifier=other)
    assert reply.status == 400 and reply.body["error"] == "invalid_grant"
    missing = await http.exchange(request, code, code_verifier=None)
    assert missing.status == 400 and "access_token" not in missing.body
    assert await _grants(db) == 0


async def test_a_code_used_twice_is_refused_and_ends_the_first_grant(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    request, code = await _code(http, member)
    first = await http.exchange(request, code)
    assert first.status == 200
    assert await _grants(db) == 1
    again = await http.exchange(request, code)
    assert again.status == 400 and again.body["error"] == "invalid_grant"
    assert await _grants(db) == 0
    # The first refresh token died with its grant.
    refreshed = await http.refresh(request.client_id, first.body["refresh_token"])
    assert refreshed.status == 400 and refreshed.body["error"] == "invalid_grant"


async def test_an_expired_code_is_refused(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    request, code = await _code(http, member)
    await db.execute("UPDATE oauth_codes SET expires_at = now() - interval '1 second'")
    reply = await http.exchange(request, code)
    assert reply.status == 400 and reply.body["error"] == "invalid_grant"
    assert await _grants(db) == 0


async def test_the_code_is_bound_to_its_redirect_uri_client_and_resource(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    request, code = await _code(http, member)
    other_redirect = await http.exchange(request, code, redirect_uri="http://127.0.0.1:9/other")
    assert other_redirect.status == 400 and other_redirect.body["error"] == "invalid_grant"

    request, code = await _code(http, member)
    other_client = await http.client_id()
    stolen = await http.exchange(request, code, client_id=other_client)
    assert stolen.status == 400 and stolen.body["error"] == "invalid_grant"
    # Presented by the wrong client, the code is not used up: its own client still can.
    assert (await http.exchange(request, code)).status == 200

    request, code = await _code(http, member)
    elsewhere = mcp_url("http://localhost", "00000000-0000-0000-0000-000000000000")
    reply = await http.exchange(request, code, resource=elsewhere)
    assert reply.status == 400 and reply.body["error"] == "invalid_target"
    assert await _grants(db) == 1


async def test_a_refresh_token_is_rotated(http: OAuthHttp, member: Member) -> None:
    request, code = await _code(http, member)
    first = (await http.exchange(request, code)).body
    second = await http.refresh(request.client_id, first["refresh_token"], member.resource)
    assert second.status == 200, second.body
    assert second.body["refresh_token"] != first["refresh_token"]
    claims = read_oauth_token(SECRET, second.body["access_token"], member.resource)
    assert (
        claims.grant_id == read_oauth_token(SECRET, first["access_token"], member.resource).grant_id
    )
    third = await http.refresh(request.client_id, second.body["refresh_token"])
    assert third.status == 200


async def test_a_refresh_token_presented_twice_ends_the_grant(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    request, code = await _code(http, member)
    first = (await http.exchange(request, code)).body
    rotated = await http.refresh(request.client_id, first["refresh_token"])
    assert rotated.status == 200
    reused = await http.refresh(request.client_id, first["refresh_token"])
    assert reused.status == 400 and reused.body["error"] == "invalid_grant"
    assert await _grants(db) == 0
    # The token it was rotated into is gone with the grant.
    after = await http.refresh(request.client_id, rotated.body["refresh_token"])
    assert after.status == 400


async def test_a_refresh_token_of_another_client_or_resource_is_refused(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    request, code = await _code(http, member)
    tokens = (await http.exchange(request, code)).body
    thief = await http.client_id()
    assert (await http.refresh(thief, tokens["refresh_token"])).status == 400
    elsewhere = mcp_url("http://localhost", "00000000-0000-0000-0000-000000000000")
    assert (await http.refresh(request.client_id, tokens["refresh_token"], elsewhere)).status == 400
    # Neither used it up nor ended the grant.
    assert (await http.refresh(request.client_id, tokens["refresh_token"])).status == 200
    assert await _grants(db) == 1


async def test_a_member_who_left_cannot_refresh(
    http: OAuthHttp, member: Member, oauth_api: Api, db: asyncpg.Connection
) -> None:
    colleague = await oauth_api.member(member.account)
    client_id = await http.client_id()
    await http.sign_in(colleague.email)
    request = AuthorizationRequest(client_id, member.resource)
    tokens = (await http.exchange(request, await http.code_for(request))).body
    await oauth_api.delete(
        f"/workspaces/{member.account.workspace_id}/members/{colleague.user_id}",
        auth=member.account,
        expect=204,
    )
    reply = await http.refresh(client_id, tokens["refresh_token"])
    assert reply.status == 400 and reply.body["error"] == "invalid_grant"
    assert await _grants(db) == 0


async def test_a_member_who_left_before_the_exchange_gets_no_tokens(
    http: OAuthHttp, member: Member, oauth_api: Api, db: asyncpg.Connection
) -> None:
    colleague = await oauth_api.member(member.account)
    client_id = await http.client_id()
    await http.sign_in(colleague.email)
    request = AuthorizationRequest(client_id, member.resource)
    code = await http.code_for(request)
    await oauth_api.delete(
        f"/workspaces/{member.account.workspace_id}/members/{colleague.user_id}",
        auth=member.account,
        expect=204,
    )
    reply = await http.exchange(request, code)
    assert reply.status == 400 and reply.body["error"] == "invalid_grant"
    assert await _grants(db) == 0


async def test_unknown_grant_types_and_garbage_are_rfc_errors(http: OAuthHttp) -> None:
    client_id = await http.client_id()
    for form in (
        {"grant_type": "password", "client_id": client_id},
        {"grant_type": "client_credentials", "client_id": client_id},
        {"grant_type": "authorization_code", "client_id": "mcpg-nobody", "code": "x"},
        {},
    ):
        reply = await http._call("POST", "/oauth/token", data=form)
        assert reply.status in (400, 401), (form, reply.status)
        assert "error" in reply.body, form


async def test_failed_attempts_are_rate_limited_per_address(make_api: AppFactory) -> None:
    api = await make_api(public_url=OAUTH_PUBLIC_URL, auth_rate_limit="3/minute")
    http = OAuthHttp(api.client.session, str(api.client.make_url("")))
    client_id = await http.client_id()
    for _ in range(3):
        reply = await http.refresh(client_id, "guessed-token")
        assert reply.status == 400 and reply.body["error"] == "invalid_grant"
    limited = await http.refresh(client_id, "guessed-token")
    assert limited.status == 429 and int(limited.headers["Retry-After"]) > 0
    assert limited.body["error"] == "temporarily_unavailable"


async def test_a_code_raced_twice_leaves_no_grant(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    # Whichever exchange wins, the other presents a used code: no grant may outlive that.
    request, code = await _code(http, member)
    replies = await asyncio.gather(http.exchange(request, code), http.exchange(request, code))
    assert sorted(r.status for r in replies) in ([200, 400], [400, 400])
    assert await _grants(db) == 0


async def test_a_refresh_token_raced_twice_leaves_no_grant(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    request, code = await _code(http, member)
    tokens = (await http.exchange(request, code)).body
    replies = await asyncio.gather(
        http.refresh(request.client_id, tokens["refresh_token"]),
        http.refresh(request.client_id, tokens["refresh_token"]),
    )
    assert sorted(r.status for r in replies) in ([200, 400], [400, 400])
    assert await _grants(db) == 0
    assert await db.fetchval("SELECT count(*) FROM oauth_refresh_tokens") == 0
