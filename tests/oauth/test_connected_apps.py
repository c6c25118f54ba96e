"""The dashboard's "Connected apps": a person's grants on their account page, every member's
on the workspace settings page for admins and owners, and revoking one, which ends its token
at once in every gateway process."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest

from gateway.accounts.access import AUTHENTICATOR
from gateway.caching.caches import MISSING
from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.browser import Browser
from tests.helpers.oauth_grants import LOOPBACK_PUBLIC_URL, Granted, grant, proxy_path, toolset_path
from tests.helpers.proxying import ACCEPT, add_server, recorder, rpc
from tests.helpers.waiting import until

BrowserFor = Callable[..., Any]

# A client chooses its own name (registration, its metadata document): markup is text here.
HOSTILE_TEXT = '<script>alert("owned")</script><img src=x onerror=alert(1)> & "Claude"'


@pytest.fixture
async def api(make_api: AppFactory) -> Api:
    """A gateway that offers OAuth (a loopback PUBLIC_URL: the dashboard's cookies are then
    not Secure-only, and the test client speaks plain http)."""
    return await make_api(public_url=LOOPBACK_PUBLIC_URL)


@pytest.fixture
async def chromium() -> AsyncIterator[Any]:
    """Headless Chromium (tests/helpers/chromium.py); its tests skip without one."""
    from tests.helpers.chromium import CHROMIUM, launched

    if CHROMIUM is None:
        pytest.skip("no Chromium: apt-get install chromium, or set CHROMIUM_PATH")
    async with launched() as browser:
        yield browser


@pytest.fixture
async def browser_for() -> AsyncIterator[BrowserFor]:
    """browser_for(api, account): a browser signed in to that gateway as the account, showing
    the account's current workspace."""
    opened: list[Browser] = []

    async def make(api: Api, account: Account) -> Browser:
        browser = Browser(api)
        opened.append(browser)
        await browser.log_in(account.email)
        await browser.post("/switch", {"workspace_id": account.workspace_id}, expect=200)
        return browser

    yield make
    for browser in opened:
        await browser.close()


async def status_of(api: Api, granted: Granted) -> int:
    reply = await api.post(
        granted.path,
        json=rpc("ping"),
        headers={"Accept": ACCEPT, **granted.headers},
    )
    return reply.status


def revoke_action(grant_id: Any) -> str:
    return f"/connected-apps/{grant_id}/revoke"


async def team(api: Api, db: asyncpg.Connection, url: str) -> tuple[Account, Account, str]:
    """An org workspace with an owner, a member, and a server."""
    owner = await api.org(await api.signup(name="Olive Owner"), name="Team")
    member = await api.member(owner)
    return owner, member, await add_server(api, db, owner, url)


# -- the account page --------------------------------------------------------------------------


async def test_the_account_page_lists_the_apps_connected_in_every_workspace(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFor
) -> None:
    owner, member, server_id = await team(api, db, "http://127.0.0.1:9/mcp")
    home = await api.signup(member.email.replace("@", "+home@"))  # another person entirely
    toolset = await api.post(
        "/toolsets", json={"name": "team-tools", "servers": [{"server_id": server_id}]}, auth=owner
    )
    on_server = await grant(api, member, proxy_path(server_id), "Claude")
    on_toolset = await grant(api, member, toolset_path(toolset.body["id"]), "ChatGPT")
    await grant(api, home, proxy_path(await add_server(api, db, home, "http://127.0.0.1:9/x")))
    browser = await browser_for(api, member)
    page = await browser.get("/account")
    assert page.has("Connected apps")
    server_name = await db.fetchval("SELECT name FROM servers WHERE id = $1::uuid", server_id)
    for text in ("Claude", "ChatGPT", server_name, "team-tools", "Team"):
        assert page.has(text), text
    for granted in (on_server, on_toolset):
        assert page.has(granted.resource)
        assert revoke_action(granted.grant_id) in page.text
    # Linked to the server's and the toolset's pages (the workspace the dashboard shows).
    assert f'href="/servers/{server_id}"' in page.text
    assert f'href="/toolsets/{toolset.body["id"]}"' in page.text
    # Someone else's grant is not theirs to see.
    assert page.text.count("/revoke") == 2


async def test_with_no_connected_apps_the_page_says_what_they_are(
    api: Api, browser_for: BrowserFor
) -> None:
    browser = await browser_for(api, await api.signup())
    page = await browser.get("/account")
    assert page.has("No connected apps. An app such as Claude, ChatGPT or your editor connects")


async def test_a_hostile_client_name_is_shown_as_text(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFor
) -> None:
    owner, _, server_id = await team(api, db, "http://127.0.0.1:9/mcp")
    await grant(api, owner, proxy_path(server_id), HOSTILE_TEXT)
    browser = await browser_for(api, owner)
    for path in ("/account", "/settings"):
        page = await browser.get(path)
        assert page.has(HOSTILE_TEXT), path
        assert HOSTILE_TEXT not in page.text, path  # escaped, never markup


async def test_revoking_ends_the_token_at_once(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFor
) -> None:
    async with recorder() as upstream:
        _, member, server_id = await team(api, db, upstream.url)
        granted = await grant(api, member, proxy_path(server_id), "Claude")
        assert await status_of(api, granted) == 200
        browser = await browser_for(api, member)
        await browser.get("/account")
        page = await browser.post(
            revoke_action(granted.grant_id), {"next": "/account#connected-apps"}, expect=200
        )
        assert page.url.endswith("/account#connected-apps") or "/account" in page.url
        assert not page.has("Revoke Claude")
        # No wait for the NOTIFY in the process that revoked it.
        assert await status_of(api, granted) == 401
    assert await db.fetchval("SELECT count(*) FROM oauth_grants") == 0


async def test_a_revocation_needs_the_forms_csrf_token(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFor
) -> None:
    owner, _, server_id = await team(api, db, "http://127.0.0.1:9/mcp")
    granted = await grant(api, owner, proxy_path(server_id))
    browser = await browser_for(api, owner)
    await browser.get("/account")
    await browser.post(revoke_action(granted.grant_id), csrf="forged", expect=403)
    await browser.post(revoke_action(granted.grant_id), csrf="", expect=403)
    assert await db.fetchval("SELECT count(*) FROM oauth_grants") == 1


# -- the workspace's apps, for admins and owners -------------------------------------------------


async def test_admins_see_every_members_apps_and_may_revoke_them(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFor
) -> None:
    owner, member, server_id = await team(api, db, "http://127.0.0.1:9/mcp")
    admin = await api.member(owner, "admin")
    members = await grant(api, member, proxy_path(server_id), "Claude")
    owners = await grant(api, owner, proxy_path(server_id), "ChatGPT")
    browser = await browser_for(api, admin)
    page = await browser.get("/settings")
    assert page.has("Connected apps")
    for granted in (members, owners):
        assert revoke_action(granted.grant_id) in page.text
    assert page.has(member.email) and page.has(owner.email)
    await browser.post(revoke_action(members.grant_id), {"next": "/settings#connected-apps"})
    assert await db.fetchval("SELECT count(*) FROM oauth_grants") == 1
    assert await status_of(api, members) == 401


async def test_a_member_cannot_revoke_another_members_app(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFor
) -> None:
    owner, member, server_id = await team(api, db, "http://127.0.0.1:9/mcp")
    owners = await grant(api, owner, proxy_path(server_id), "ChatGPT")
    browser = await browser_for(api, member)
    page = await browser.get("/settings")
    # A member sees no one else's apps...
    assert revoke_action(owners.grant_id) not in page.text
    assert not page.has("ChatGPT")
    # ...and cannot revoke one by its id: the same answer as for no such app.
    await browser.post(revoke_action(owners.grant_id), {}, expect=404)
    await browser.post(revoke_action("00000000-0000-0000-0000-000000000000"), {}, expect=404)
    await browser.post(revoke_action("not-an-id"), {}, expect=404)
    assert await db.fetchval("SELECT count(*) FROM oauth_grants") == 1


async def test_an_admin_of_another_workspace_cannot_revoke_an_app_here(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFor
) -> None:
    owner, _, server_id = await team(api, db, "http://127.0.0.1:9/mcp")
    owners = await grant(api, owner, proxy_path(server_id))
    stranger = await api.signup()  # the owner of their own workspace
    browser = await browser_for(api, stranger)
    await browser.get("/account")
    await browser.post(revoke_action(owners.grant_id), {}, expect=404)
    assert await db.fetchval("SELECT count(*) FROM oauth_grants") == 1


async def test_the_revocation_returns_only_to_a_page_of_this_site(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFor
) -> None:
    owner, _, server_id = await team(api, db, "http://127.0.0.1:9/mcp")
    granted = await grant(api, owner, proxy_path(server_id))
    browser = await browser_for(api, owner)
    await browser.get("/account")
    page = await browser.post(
        revoke_action(granted.grant_id), {"next": "https://evil.example/"}, follow=False
    )
    assert page.status == 303
    assert page.headers["Location"] == "/"


# -- in every process ----------------------------------------------------------------------------


async def test_a_revocation_in_one_gateway_ends_the_token_in_another(
    make_api: AppFactory, db: asyncpg.Connection, browser_for: BrowserFor
) -> None:
    """Two gateway processes' apps on one database, each with its own caches and its own
    LISTEN connection: the one that did not revoke hears it through NOTIFY."""
    first = await make_api(public_url=LOOPBACK_PUBLIC_URL)
    second = await make_api(public_url=LOOPBACK_PUBLIC_URL)
    async with recorder() as upstream:
        _, member, server_id = await team(first, db, upstream.url)
        granted = await grant(first, member, proxy_path(server_id), "Claude")
        assert await status_of(second, granted) == 200
        grants = second.app[AUTHENTICATOR].grants
        assert grants.cache.peek(granted.grant_id) is not MISSING  # held by the second one
        browser = await browser_for(first, member)
        await browser.get("/account")
        await browser.post(revoke_action(granted.grant_id), {}, expect=200)
        await until(lambda: grants.cache.peek(granted.grant_id) is MISSING, within=10)
        assert await status_of(second, granted) == 401
        assert await status_of(first, granted) == 401


# -- a phone's width -----------------------------------------------------------------------------


async def test_connected_apps_fit_a_phone(api: Api, db: asyncpg.Connection, chromium: Any) -> None:
    from tests.helpers.chromium import WIDTHS, fits_a_phone, signed_in

    owner = await api.signup(name="Ada Lovelace")  # owner of the workspace the pages show
    server_id = await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    await grant(
        api,
        owner,
        proxy_path(server_id),
        "Claude Desktop with a rather long name",
        client_id="https://claude.ai/oauth/mcp-oauth-client-metadata-with-a-long-path.json",
    )
    base = str(api.client.make_url("")).rstrip("/")
    visitor = await signed_in(chromium, base, owner, WIDTHS["desktop"])
    page = visitor.page
    for path in ("/account", "/settings"):
        await visitor.open(path)
        button = page.get_by_role("button", name=re.compile("Revoke Claude"))
        assert await button.count() == 1
        await fits_a_phone(visitor, f"connected-apps{path.replace('/', '-')}", WIDTHS["desktop"])
    assert visitor.problems == [], visitor.problems
    await page.context.close()
