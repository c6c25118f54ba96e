"""GET and POST /oauth/authorize: sign-in through the dashboard, the consent page, Allow and
Deny, and the requests refused before any consent."""

from __future__ import annotations

import uuid

import asyncpg

from tests.helpers.api import Api
from tests.helpers.oauth import (
    OAUTH_PUBLIC_URL,
    AuthorizationRequest,
    OAuthHttp,
    hidden_fields,
    mcp_url,
)
from tests.oauth.conftest import Member


async def test_allow_redirects_with_a_code_the_state_and_the_issuer(
    http: OAuthHttp, member: Member
) -> None:
    client_id = await http.client_id()
    await http.sign_in(member.account.email)
    request = AuthorizationRequest(client_id, member.resource)
    reply = await http.authorize(request)
    assert reply.status == 302
    location = reply.location
    assert str(location.with_query(None)) == request.redirect_uri
    assert location.query["state"] == request.state
    assert location.query["iss"] == OAUTH_PUBLIC_URL
    assert location.query["code"]


async def test_signed_out_the_login_page_comes_back_to_the_consent_page(
    http: OAuthHttp, member: Member
) -> None:
    client_id = await http.client_id()
    request = AuthorizationRequest(client_id, member.resource)
    first = await http.authorize_page(request)
    assert first.status == 303
    login = first.location
    assert login.path == "/login"
    signed_in = await http.sign_in(member.account.email, next_page=login.query["next"])
    back = signed_in.location
    assert back.path == "/oauth/authorize"
    assert dict(back.query) == request.query()
    page = await http._call("GET", str(back))
    assert page.status == 200 and 'value="allow"' in page.body
    reply = await http.decide(page.body)
    assert reply.location.query["state"] == request.state and reply.location.query["code"]


async def test_the_consent_page_names_the_client_the_server_and_the_workspace(
    http: OAuthHttp, member: Member
) -> None:
    client_id = await http.client_id(
        name="Claude", redirect_uris=["https://claude.ai/api/mcp/auth_callback"]
    )
    await http.sign_in(member.account.email)
    request = AuthorizationRequest(
        client_id, member.resource, redirect_uri="https://claude.ai/api/mcp/auth_callback"
    )
    page = await http.authorize_page(request)
    assert page.status == 200
    assert "Claude" in page.body and "weather" in page.body and "Acme Corp" in page.body
    assert "claude.ai" in page.body
    assert 'id="mismatch-warning"' not in page.body
    assert page.headers["X-Frame-Options"] == "DENY"
    policy = page.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in policy
    # The form's answer may redirect to the client (browsers apply form-action to it).
    assert "form-action 'self' https://claude.ai;" in policy


async def test_a_name_its_redirect_host_does_not_mention_is_warned_about(
    http: OAuthHttp, member: Member
) -> None:
    client_id = await http.client_id(name="Claude", redirect_uris=["https://evil.example/cb"])
    await http.sign_in(member.account.email)
    request = AuthorizationRequest(
        client_id, member.resource, redirect_uri="https://evil.example/cb"
    )
    page = await http.authorize_page(request)
    assert page.status == 200
    assert 'id="mismatch-warning"' in page.body and "evil.example" in page.body


async def test_a_hostile_client_name_is_shown_as_text(http: OAuthHttp, member: Member) -> None:
    await http.sign_in(member.account.email)
    for name in ("<script>alert(1)</script>", '"><img src=x onerror=alert(1)>'):
        client_id = await http.client_id(name=name)
        page = await http.authorize_page(AuthorizationRequest(client_id, member.resource))
        assert page.status == 200
        assert name not in page.body
        assert "<script>alert" not in page.body and "<img src=x" not in page.body
        assert (
            "&lt;script&gt;alert(1)&lt;/script&gt;" in page.body or "&#34;&gt;&lt;img" in page.body
        )


async def test_a_non_member_cannot_consent(
    http: OAuthHttp, member: Member, oauth_api: Api, db: asyncpg.Connection
) -> None:
    stranger = await oauth_api.signup(name="Stranger")
    client_id = await http.client_id()
    await http.sign_in(stranger.email)
    request = AuthorizationRequest(client_id, member.resource)
    page = await http.authorize_page(request)
    assert page.status == 403
    assert "not a member of the workspace" in page.body
    # Nor by posting the form of another page (with the stranger's own CSRF token).
    own = await http._call("GET", "/account")
    token = dict(hidden_fields(own.body))["csrf_token"]
    form = [*request.query().items(), ("csrf_token", token), ("decision", "allow")]
    reply = await http._call("POST", "/oauth/authorize", data=form)
    assert reply.status == 403
    assert await db.fetchval("SELECT count(*) FROM oauth_codes") == 0


async def test_an_unknown_server_is_a_404_page(http: OAuthHttp, member: Member) -> None:
    client_id = await http.client_id()
    await http.sign_in(member.account.email)
    resource = mcp_url(OAUTH_PUBLIC_URL, str(uuid.uuid4()))
    page = await http.authorize_page(AuthorizationRequest(client_id, resource))
    assert page.status == 404


async def test_a_toolset_can_be_consented_to(
    http: OAuthHttp, member: Member, oauth_api: Api
) -> None:
    toolset = await oauth_api.post(
        "/toolsets",
        json={"name": "tools-for-agents", "servers": [{"server_id": member.server_id}]},
        auth=member.account,
        expect=201,
    )
    client_id = await http.client_id()
    await http.sign_in(member.account.email)
    request = AuthorizationRequest(
        client_id, mcp_url(OAUTH_PUBLIC_URL, toolset.body["id"], "toolsets")
    )
    page = await http.authorize_page(request)
    assert page.status == 200 and "tools-for-agents" in page.body
    reply = await http.decide(page.body)
    assert reply.location.query["code"]


async def test_deny_redirects_with_access_denied_the_state_and_the_issuer(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    client_id = await http.client_id()
    await http.sign_in(member.account.email)
    request = AuthorizationRequest(client_id, member.resource)
    reply = await http.authorize(request, decision="deny")
    assert reply.status == 302
    query = reply.location.query
    assert query["error"] == "access_denied"
    assert query["state"] == request.state and query["iss"] == OAUTH_PUBLIC_URL
    assert "code" not in query
    assert await db.fetchval("SELECT count(*) FROM oauth_codes") == 0


async def test_a_consent_form_without_the_csrf_token_is_refused(
    http: OAuthHttp, member: Member, db: asyncpg.Connection
) -> None:
    client_id = await http.client_id()
    await http.sign_in(member.account.email)
    request = AuthorizationRequest(client_id, member.resource)
    form = [*request.query().items(), ("decision", "allow")]
    reply = await http._call("POST", "/oauth/authorize", data=form)
    assert reply.status == 403
    assert await db.fetchval("SELECT count(*) FROM oauth_codes") == 0


async def test_errors_about_the_client_or_redirect_uri_are_pages_never_redirects(
    http: OAuthHttp, member: Member
) -> None:
    client_id = await http.client_id()
    cases = {
        "unknown client": AuthorizationRequest("mcpg-nobody", member.resource),
        "unregistered redirect": AuthorizationRequest(
            client_id, member.resource, redirect_uri="https://elsewhere.example/cb"
        ),
        "no redirect": AuthorizationRequest(client_id, member.resource, redirect_uri=""),
    }
    for what, request in cases.items():
        if not request.redirect_uri:
            request.extra["redirect_uri"] = None  # type: ignore[assignment]
        reply = await http.authorize_page(request)
        assert reply.status == 400, what
        assert "Location" not in reply.headers, what


async def test_the_loopback_port_may_differ_the_path_may_not(
    http: OAuthHttp, member: Member
) -> None:
    client_id = await http.client_id(redirect_uris=["http://127.0.0.1:1234/callback"])
    await http.sign_in(member.account.email)
    other_port = AuthorizationRequest(
        client_id, member.resource, redirect_uri="http://127.0.0.1:5678/callback"
    )
    reply = await http.authorize(other_port)
    assert reply.location.port == 5678 and reply.location.query["code"]
    other_path = AuthorizationRequest(
        client_id, member.resource, redirect_uri="http://127.0.0.1:1234/other"
    )
    assert (await http.authorize_page(other_path)).status == 400


async def test_other_errors_go_back_to_the_client_with_state_and_issuer(
    http: OAuthHttp, member: Member
) -> None:
    client_id = await http.client_id()
    await http.sign_in(member.account.email)
    cases = {
        "missing PKCE": (
            {"code_challenge": None, "code_challenge_method": None},
            "invalid_request",
        ),
        "plain PKCE": ({"code_challenge_method": "plain"}, "invalid_request"),
        "no method": ({"code_challenge_method": None}, "invalid_request"),
        "no resource": ({"resource": None}, "invalid_target"),
        "another site's resource": (
            {"resource": f"https://elsewhere.example/api/v1/proxy/{member.server_id}/mcp"},
            "invalid_target",
        ),
        "a REST URL": ({"resource": f"{OAUTH_PUBLIC_URL}/api/v1/servers"}, "invalid_target"),
        "token response type": ({"response_type": "token"}, "unsupported_response_type"),
    }
    for what, (extra, error) in cases.items():
        request = AuthorizationRequest(client_id, member.resource, extra=extra)  # type: ignore[arg-type]
        reply = await http.authorize_page(request)
        assert reply.status == 302, (what, reply.status, reply.body)
        query = reply.location.query
        assert query["error"] == error, (what, dict(query))
        assert query["state"] == request.state and query["iss"] == OAUTH_PUBLIC_URL, what
        assert "code" not in query
