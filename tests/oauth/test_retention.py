"""Retention of OAuth rows: expired codes (a day after they expire) and refresh tokens go, and
clients nobody uses; what a live grant needs stays."""

from __future__ import annotations

import asyncpg

from gateway.background.retention import run_once
from gateway.config import Settings
from tests.helpers.api import Api
from tests.helpers.oauth import AuthorizationRequest, OAuthHttp
from tests.oauth.conftest import Member


async def test_expired_rows_and_unused_clients_go_live_grants_stay(
    http: OAuthHttp, member: Member, oauth_api: Api, db: asyncpg.Connection, settings: Settings
) -> None:
    request, tokens = await http.tokens(member.account.email, member.resource)
    # A code never exchanged, long expired; a rotated refresh token past its expiry.
    stale = AuthorizationRequest(request.client_id, member.resource)
    await http.code_for(stale)
    await db.execute(
        "UPDATE oauth_codes SET expires_at = now() - interval '2 days' WHERE grant_id IS NULL"
    )
    rotated = await http.refresh(request.client_id, tokens["refresh_token"])
    assert rotated.status == 200
    await db.execute(
        "UPDATE oauth_refresh_tokens SET expires_at = now() - interval '1 second' "
        "WHERE rotated_at IS NOT NULL"
    )
    unused = await http.client_id()
    await db.execute("UPDATE oauth_clients SET created_at = now() - interval '31 days'")
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    try:
        done = await run_once(pool, settings)
    finally:
        await pool.close()
    assert done.failed == []
    assert done.oauth_rows == 3
    clients = {r[0] for r in await db.fetch("SELECT client_id FROM oauth_clients")}
    assert clients == {request.client_id}  # the one with a grant stays
    assert unused not in clients
    assert await db.fetchval("SELECT count(*) FROM oauth_codes") == 1  # the exchanged one
    assert await db.fetchval("SELECT count(*) FROM oauth_refresh_tokens") == 1
    # The grant works on.
    assert (await http.refresh(request.client_id, rotated.body["refresh_token"])).status == 200
