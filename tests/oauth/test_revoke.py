"""POST /oauth/revoke (RFC 7009): a refresh token or an access token ends its grant; anything
else is answered 200 all the same."""

from __future__ import annotations

import asyncpg

from tests.helpers.oauth import AuthorizationRequest, OAuthHttp
from tests.oauth.conftest import Member


async def _tokens(http: OAuthHttp, member: Member) -> tuple[AuthorizationRequest, dict]:  # type: ignore[type-arg]
    return await http.tokens(member.account.email, member.resource)


async def test_revoking_a_refresh_token_ends_its_grant(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    request, tokens = await _tokens(http, member)
    reply = await http.revoke(request.client_id, tokens["refresh_token"])
    assert reply.status == 200
    assert await db.fetchval("SELECT count(*) FROM oauth_grants") == 0
    assert (await http.refresh(request.client_id, tokens["refresh_token"])).status == 400


async def test_revoking_an_access_token_ends_its_grant(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    request, tokens = await _tokens(http, member)
    assert (await http.revoke(request.client_id, tokens["access_token"])).status == 200
    assert await db.fetchval("SELECT count(*) FROM oauth_grants") == 0


async def test_unknown_tokens_and_other_clients_tokens_are_answered_200_and_kept(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    request, tokens = await _tokens(http, member)
    other = await http.client_id()
    assert (await http.revoke(other, tokens["refresh_token"])).status == 200
    assert (await http.revoke(other, tokens["access_token"])).status == 200
    assert (await http.revoke(request.client_id, "no-such-token")).status == 200
    assert await db.fetchval("SELECT count(*) FROM oauth_grants") == 1
    missing = await http._call("POST", "/oauth/revoke", data={"client_id": other})
    assert missing.status == 400 and missing.body["error"] == "invalid_request"
