"""Fixtures of the OAuth tests: an app serving OAuth (a loopback PUBLIC_URL), the flow's HTTP
steps against it, and a member with a server to consent to."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.helpers.alerting import add_server
from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.oauth import OAUTH_PUBLIC_URL, OAuthHttp, mcp_url


@pytest.fixture
async def oauth_api(make_api: AppFactory) -> Api:
    return await make_api(public_url=OAUTH_PUBLIC_URL)


@pytest.fixture
def http(oauth_api: Api) -> OAuthHttp:
    return OAuthHttp(oauth_api.client.session, str(oauth_api.client.make_url("")))


@dataclass
class Member:
    account: Account
    server_id: str
    resource: str


@pytest.fixture
async def member(oauth_api: Api) -> Member:
    """A user owning a workspace with one server, and that server's MCP URL."""
    owner = await oauth_api.org(await oauth_api.signup(name="Owner"), name="Acme Corp")
    server_id = await add_server(oauth_api, owner, "weather")
    return Member(owner, server_id, mcp_url(OAUTH_PUBLIC_URL, server_id))
