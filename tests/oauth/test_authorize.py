"""GET and POST /oauth/authorize: sign-in through the dashboard, the consent page, Allow and
Deny, and the requests refused before any consent."""

from __future__ import annotations

from tests.helpers.oauth import OAUTH_PUBLIC_URL, AuthorizationRequest, OAuthHttp
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
