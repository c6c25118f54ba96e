"""Signing up, logging in and out, invitations and workspaces, through the pages' forms."""

from __future__ import annotations

import re
from html import unescape
from urllib.parse import unquote

import asyncpg

from tests.helpers.api import Api, AppFactory
from tests.helpers.browser import Browser, BrowserFactory, Page
from tests.helpers.mail import Inbox

SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}


async def test_signed_out_the_dashboard_is_the_login_page(browser_for: BrowserFactory) -> None:
    browser = await browser_for()
    page = await browser.get("/")
    assert page.url.endswith("/login")
    assert page.has("Log in")
    deep = await browser.get("/servers?status=down")
    assert unquote(deep.url).endswith("/login?next=/servers?status=down")


async def test_sign_up_lands_on_the_overview_with_a_safe_session_cookie(
    browser_for: BrowserFactory, db: asyncpg.Connection
) -> None:
    browser = await browser_for()
    await browser.get("/signup")
    form = {"name": "Grace", "email": "Grace@Example.com", "password": "password123"}
    async with browser.http.post(
        browser.url("/signup"),
        data={"csrf_token": browser.csrf, **form},
        allow_redirects=False,
    ) as response:
        assert response.status == 303
        assert response.headers["Location"] == "/"
        cookie = next(
            c for c in response.headers.getall("Set-Cookie") if c.startswith("mcpg_session=")
        )
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # PUBLIC_URL is http:// in the tests
    overview = await browser.get("/")
    assert overview.has("Overview") and overview.has("Grace's workspace")
    # Only a hash of the session id is stored.
    raw = cookie.split(";", 1)[0].split("=", 1)[1]
    stored = await db.fetchval("SELECT id_hash FROM dashboard_sessions")
    assert stored != raw and len(stored) == 64


async def test_session_cookie_is_secure_behind_https(make_api: AppFactory) -> None:
    secure_api = await make_api(public_url="https://gateway.example")
    browser = Browser(secure_api)
    try:
        # Over the tests' plain HTTP the client keeps no Secure cookie: carried by hand.
        async with browser.http.get(browser.url("/signup")) as response:
            form_cookie = response.cookies["__Host-mcpg_form"]
            assert form_cookie["secure"]
            token = Page(200, await response.text(), response.headers, "").csrf
        form = {
            "csrf_token": token,
            "name": "S",
            "email": "s@example.com",
            "password": "password123",
        }
        async with browser.http.post(
            browser.url("/signup"),
            data=form,
            cookies={"__Host-mcpg_form": form_cookie.value},
            allow_redirects=False,
        ) as response:
            assert response.status == 303
            assert response.cookies["__Host-mcpg_session"]["secure"]
    finally:
        await browser.close()


async def test_every_form_needs_its_csrf_token(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.signup()
    browser = await browser_for()
    await browser.get("/login")
    # No token, a made-up one, and the token of another browser: all refused, nothing done.
    for token in ("", "0" * 64):
        page = await browser.post(
            "/login", {"email": owner.email, "password": "password123"}, csrf=token
        )
        assert page.status == 403 and page.has("did not come from this site")
    other = await browser_for()
    await other.get("/login")
    page = await browser.post(
        "/login", {"email": owner.email, "password": "password123"}, csrf=other.csrf
    )
    assert page.status == 403
    signed_in = await browser_for(owner)
    page = await signed_in.post("/logout", csrf=browser.csrf)
    assert page.status == 403
    assert (await signed_in.get("/")).has("Overview")  # still signed in


async def test_log_in_errors_and_the_way_back(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.signup()
    browser = await browser_for()
    await browser.get("/login")
    page = await browser.post("/login", {"email": owner.email, "password": "wrong-password"})
    assert page.status == 401 and page.has("invalid email or password")
    page = await browser.post("/login", {"email": "not an email", "password": "x"})
    assert page.status == 422 and page.has("email")
    await browser.get("/login?next=/tool-calls%3Fstatus%3Derror")
    page = await browser.post(
        "/login",
        {"email": owner.email, "password": "password123", "next": "/tool-calls?status=error"},
    )
    assert page.url.endswith("/tool-calls?status=error")


async def test_never_an_open_redirect(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.signup()
    for target in (
        "//evil.example/",
        "https://evil.example/",
        "/\\evil.example",
        "javascript:alert(1)",
        "/\t/evil.example",  # browsers drop tabs and newlines: //evil.example
        "/\n/evil.example",
        "/\r\n/evil.example",
        "/\x00x",
        "/%09/ok",  # encoded, it stays a path of this site
    ):
        browser = await browser_for()
        await browser.get("/login")
        form = {"csrf_token": browser.csrf, "email": owner.email, "password": "password123"}
        async with browser.http.post(
            browser.url("/login"), data={**form, "next": target}, allow_redirects=False
        ) as response:
            location = response.headers["Location"]
        assert location in ("/", "/%09/ok"), (target, location)
        # Signed in, the login page sends onwards at once: the same rule.
        async with browser.http.get(
            browser.url("/login"), params={"next": target}, allow_redirects=False
        ) as response:
            assert response.headers["Location"] in ("/", "/%09/ok"), target
            assert response.headers["X-Frame-Options"] == "DENY"  # redirects are pages too


async def test_unreadable_forms_are_400_pages(browser_for: BrowserFactory) -> None:
    browser = await browser_for()
    await browser.get("/login")
    for body, content_type in (
        (b"email=\xff\xfe&password=x", "application/x-www-form-urlencoded"),
        (b"--x\r\nbroken", "multipart/form-data"),
        (b"--x\r\nbroken", "multipart/form-data; boundary=y"),
    ):
        async with browser.http.post(
            browser.url("/login"), data=body, headers={"Content-Type": content_type}
        ) as response:
            assert response.status == 400, content_type
            assert "could not be read" in await response.text()


async def test_signing_in_again_ends_the_previous_session(
    api: Api, browser_for: BrowserFactory, db: asyncpg.Connection
) -> None:
    first, second = await api.signup(), await api.signup()
    browser = await browser_for(first)
    await browser.log_in(second.email)
    assert await db.fetchval("SELECT count(*) FROM dashboard_sessions") == 1
    assert await db.fetchval("SELECT user_id::text FROM dashboard_sessions") == second.user_id


async def test_log_out_ends_the_session_on_the_server(
    api: Api, browser_for: BrowserFactory, db: asyncpg.Connection
) -> None:
    owner = await api.signup()
    browser = await browser_for(owner)
    cookie = next(c for c in browser.http.cookie_jar if c.key == "mcpg_session").value
    page = await browser.post("/logout")
    assert page.url.endswith("/login")
    assert await db.fetchval("SELECT count(*) FROM dashboard_sessions") == 0
    # The old cookie, replayed, opens nothing.
    replay = Browser(api)
    try:
        async with replay.http.get(
            replay.url("/"), headers={"Cookie": f"mcpg_session={cookie}"}, allow_redirects=False
        ) as response:
            assert response.status == 303 and response.headers["Location"] == "/login"
    finally:
        await replay.close()


async def test_pages_and_static_files_carry_the_security_headers(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.signup()
    browser = await browser_for(owner)
    for path in ("/", "/login", "/static/app.css", "/static/app.js", "/no-such-page"):
        async with browser.http.get(browser.url(path)) as response:
            for name, value in SECURITY_HEADERS.items():
                assert response.headers.get(name) == value, (path, name)
            csp = response.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "style-src 'self'" in csp
            assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    missing = await browser.get("/no-such-page", expect=404)
    assert missing.has("Not found") and "<html" in missing.text
    assert await browser.get("/static/../gateway/app.py", expect=404)


async def test_an_invitation_link_signs_up_into_the_workspace(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.signup()
    org = await api.org(owner, "Acme <b>Labs</b>")
    invite = await api.invite(org, "newcomer@example.com", role="admin")
    token = invite["invite_url"].rsplit("/", 1)[1]
    browser = await browser_for()
    page = await browser.get(f"/invite/{token}")
    assert page.has("Join Acme <b>Labs</b>") and "<b>Labs</b>" not in page.text
    page = await browser.get(f"/signup?invite={token}")
    assert page.has("Acme <b>Labs</b>") and page.has("as admin")
    page = await browser.post(
        "/signup",
        {
            "name": "New",
            "email": "newcomer@example.com",
            "password": "password123",
            "invite_token": token,
        },
    )
    assert page.has("Overview") and page.has("Acme <b>Labs</b>")
    # Used: the link now leads nowhere.
    assert (await browser.get(f"/invite/{token}", expect=404)).has("expired")
    for nonsense in ("%00", "x" * 5000):
        await browser.get(f"/invite/{nonsense}", expect=404)
        await browser.get(f"/signup?invite={nonsense}", expect=200)


async def test_a_signed_in_user_accepts_an_invitation(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.signup()
    org = await api.org(owner, "Beta")
    invitee = await api.signup("invitee@example.com")
    token = (await api.invite(org, invitee.email))["invite_url"].rsplit("/", 1)[1]
    stranger = await browser_for(await api.signup())
    page = await stranger.get(f"/invite/{token}")
    assert page.has("Log out and sign in as invitee@example.com")
    assert (await stranger.post(f"/invite/{token}")).status == 403
    browser = await browser_for(invitee)
    page = await browser.get(f"/invite/{token}")
    page = await browser.post(f"/invite/{token}")
    assert page.url.endswith("/") and page.has("Beta (member)")


async def test_switching_workspace(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.signup()
    org = await api.org(owner, "Gamma")
    other = await api.org(await api.signup(), "Not mine")
    browser = await browser_for(owner)
    page = await browser.post("/switch", {"workspace_id": org.workspace_id, "next": "/"})
    assert page.has("Gamma · the last 24 hours")
    page = await browser.post("/switch", {"workspace_id": other.workspace_id})
    assert page.status == 404
    page = await browser.post("/switch", {"workspace_id": "not-a-uuid"})
    assert page.status == 404


async def test_the_signup_page_follows_the_signup_policy(make_api: AppFactory) -> None:
    closed = Browser(await make_api(signup="closed"))
    try:
        page = await closed.get("/signup")
        assert page.has("signing up is closed") and 'action="/signup"' not in page.text
        assert not (await closed.get("/login")).has("Sign up")
    finally:
        await closed.close()


# -- the account page: invitations only for whoever controls the address ---------------------


async def test_an_unverified_account_sees_its_invitations_but_cannot_accept_them_in_place(
    api: Api, browser_for: BrowserFactory
) -> None:
    """Mallory signed up with the invited address: the account page lists the invitation
    (it was sent to that address) but offers no way to accept it without the emailed link."""
    owner = await api.org(await api.signup(name="Olga"), name="Acme")
    invite = await api.invite(owner, "ada@example.com", role="admin")
    token = invite["invite_url"].rsplit("/", 1)[1]
    mallory = await api.signup("ada@example.com", name="Not Ada")
    browser = await browser_for(mallory)
    page = await browser.get("/account")
    assert page.has("Acme") and page.has("Open the link in the invitation email")
    assert token not in page.text and 'action="/invite/' not in page.text
    assert page.has("This gateway sends no email, so addresses cannot be verified here")
    refused = await browser.post("/account/verify-email")
    assert refused.status == 400 and refused.has("SMTP_URL")
    assert (await browser.post(f"/invite/{'x' * 43}")).status == 404
    members = await api.get(f"/workspaces/{owner.workspace_id}/members", auth=owner)
    assert mallory.user_id not in {m["user_id"] for m in members.body}


async def test_the_emailed_link_verifies_the_address_then_invitations_are_accepted_in_place(
    make_api: AppFactory, smtp: Inbox
) -> None:
    api = await make_api(smtp_url=smtp.url)
    owner = await api.org(await api.signup(name="Olga"), name="Acme")
    await api.invite(owner, "ada@example.com", role="admin")
    browser, stranger = Browser(api), Browser(api)
    try:
        await browser.get("/signup")
        await browser.post(
            "/signup", {"name": "Ada", "email": "ada@example.com", "password": "password123"}
        )
        page = await browser.get("/account")
        assert page.has("Open the link in the invitation email")
        [mail] = [m for m in await smtp.received(api, "ada@example.com") if "verify" in m.body]
        link = f"/verify-email/{mail.link('/verify-email')}"

        # Opened signed out: log in first, and only as the account it was sent for.
        signed_out = await stranger.get(link)
        assert "/login?next=" in unquote(signed_out.url)
        other = await api.signup("someone@example.com")
        await stranger.log_in(other.email)
        assert (await stranger.get(link, expect=403)).has("another account")
        assert (await stranger.post(link, csrf=stranger.csrf)).status == 403

        page = await browser.get(link)
        assert page.has("Confirm ada@example.com")
        page = await browser.post(link)
        assert page.url.endswith("/account?done=verified")
        assert page.has("Your email address is verified.")
        assert not page.has("Email me a confirmation link")
        page = await browser.post(page_action(page, "/invite/"))
        assert page.url.endswith("/") and page.has("Acme (admin)")
    finally:
        await browser.close()
        await stranger.close()


async def test_the_account_page_sends_a_new_link_within_the_rate(
    make_api: AppFactory, smtp: Inbox
) -> None:
    api = await make_api(smtp_url=smtp.url)
    ada = await api.signup("ada@example.com")  # the first link
    browser = Browser(api)
    try:
        await browser.log_in(ada.email)
        await browser.get("/account")
        for _ in range(2):
            page = await browser.post("/account/verify-email")
            assert page.url.endswith("/account?done=sent") and page.has("is on its way")
        page = await browser.post("/account/verify-email")
        assert page.status == 429 and int(page.headers["Retry-After"]) > 0
        assert page.has("too many attempts") and page.has("Change password")
        assert len(await smtp.received(api, "ada@example.com")) == 3
    finally:
        await browser.close()


def page_action(page: Page, prefix: str) -> str:
    """The action of the page's first form posting to an address starting with `prefix`."""
    found = re.search(rf'action="({re.escape(prefix)}[^"]+)"', page.text)
    assert found is not None, f"no form posting to {prefix}... on {page.url}"
    return unescape(found.group(1))


# -- changing the password -------------------------------------------------------------------


async def test_changing_the_password_signs_out_every_other_session(
    api: Api, browser_for: BrowserFactory, db: asyncpg.Connection
) -> None:
    ada = await api.signup("ada@example.com")
    browser = await browser_for(ada)
    elsewhere = await browser_for(ada)
    form = {
        "current_password": "password123",
        "new_password": "new password 1",
        "new_password_again": "new password 1",
    }
    await browser.get("/account")
    page = await browser.post("/account/password", {**form, "current_password": "wrong!!!"})
    assert page.status == 403 and page.has("current_password is not the password")
    page = await browser.post("/account/password", {**form, "new_password_again": "other one"})
    assert page.status == 422 and page.has("does not match the new password")
    short = {**form, "new_password": "short", "new_password_again": "short"}
    page = await browser.post("/account/password", short)
    assert page.status == 422 and 'id="password-new_password-error"' in page.text
    await api.post("/auth/refresh", json={"refresh_token": ada.refresh_token}, expect=200)

    page = await browser.post("/account/password", form)
    assert page.url.endswith("/account?done=password") and page.has("Your password was changed")
    # This browser goes on (with a new session); the other one and the API's are signed out.
    assert (await browser.get("/settings")).url.endswith("/settings")
    assert (await elsewhere.get("/settings")).url.endswith("/login?next=/settings")
    assert await db.fetchval("SELECT count(*) FROM dashboard_sessions") == 1
    await api.post("/auth/refresh", json={"refresh_token": ada.refresh_token}, expect=401)
    await elsewhere.get("/login")
    failed = await elsewhere.post("/login", {"email": ada.email, "password": "password123"})
    assert failed.status == 401
    await elsewhere.log_in(ada.email, "new password 1")


async def test_a_password_changed_through_the_api_signs_the_dashboard_out(
    api: Api, browser_for: BrowserFactory
) -> None:
    ada = await api.signup()
    browser = await browser_for(ada)
    body = {"current_password": "password123", "new_password": "new password 1"}
    await api.post("/auth/change-password", json=body, auth=ada, expect=200)
    assert (await browser.get("/settings")).url.endswith("/login?next=/settings")
