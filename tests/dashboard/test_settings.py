"""Workspace settings: the workspace, its members, invitations and API keys, by role."""

from __future__ import annotations

import re
import uuid
from typing import Any

from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.browser import Browser, BrowserFactory, Page

# A new workspace of one's own is anyone's to start: not a control of this workspace.
_ACTION = re.compile(r'<form[^>]*action="(/settings(?!/workspaces)[^"#]*)')
_INVITE_URL = re.compile(r"http://gateway\.test/invite/[A-Za-z0-9_-]+")


def actions(page: Page) -> set[str]:
    """Where the page's settings forms post: the controls it offers."""
    return set(_ACTION.findall(page.text))


async def join(api: Api, admin: Account, role: str, name: str = "Test User") -> Account:
    """Someone who signed up through an invitation to admin's workspace, with `role`."""
    email = f"{uuid.uuid4().hex[:10]}@example.com"
    invite = await api.invite(admin, email, "member" if role == "owner" else role)
    account = await api.signup(email, name=name, invite_token=invite["invite_url"].rsplit("/")[-1])
    if role == "owner":
        await api.patch(
            f"/workspaces/{admin.workspace_id}/members/{account.user_id}",
            json={"role": "owner"},
            auth=admin,
            expect=200,
        )
    return account


async def workspace_of(api: Api, owner: Account) -> dict[str, Any]:
    reply = await api.get(f"/workspaces/{owner.workspace_id}", auth=owner, expect=200)
    workspace: dict[str, Any] = reply.body
    return workspace


async def roles_in(api: Api, owner: Account) -> dict[str, str]:
    reply = await api.get(f"/workspaces/{owner.workspace_id}/members", auth=owner, expect=200)
    return {m["user_id"]: m["role"] for m in reply.body}


async def listed(api: Api, owner: Account, what: str) -> list[dict[str, Any]]:
    reply = await api.get(f"/workspaces/{owner.workspace_id}/{what}", auth=owner, expect=200)
    items: list[dict[str, Any]] = reply.body
    return items


async def test_each_role_sees_exactly_the_controls_it_may_use(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(name="Olive Owner"), "Acme")
    admin = await join(api, owner, "admin", "Adam Admin")
    member = await join(api, owner, "member", "Mel Member")
    invite = await api.invite(owner, "pending@example.com", role="admin")
    await api.api_key(owner, "ci agent")
    key = (await listed(api, owner, "api-keys"))[0]
    people = (owner, admin, member)

    page = await (await browser_for(owner)).get("/settings")
    assert 'aria-current="page">Settings' in page.text
    for text in ("Acme", "acme", "Organisation workspace", "Olive Owner", "Adam Admin"):
        assert page.has(text), text
    assert page.has("pending@example.com") and page.has(key["prefix"])
    assert page.has("Delete workspace Acme") and page.has("Remove Mel Member")
    assert page.has("Save role of Adam Admin") and page.has("Revoke ci agent")
    assert 'data-confirm="Delete the workspace Acme' in page.text
    assert actions(page) == {
        "/settings/workspace",
        "/settings/delete",
        *(f"/settings/members/{p.user_id}/role" for p in people),
        *(f"/settings/members/{p.user_id}/remove" for p in people),
        "/settings/invites",
        f"/settings/invites/{invite['id']}/revoke",
        "/settings/api-keys",
        f"/settings/api-keys/{key['id']}/revoke",
    }

    # An admin renames, invites and manages keys, and may remove members only.
    page = await (await browser_for(admin)).get("/settings")
    assert actions(page) == {
        "/settings/workspace",
        f"/settings/members/{member.user_id}/remove",
        "/settings/invites",
        f"/settings/invites/{invite['id']}/revoke",
        "/settings/api-keys",
        f"/settings/api-keys/{key['id']}/revoke",
    }
    assert not page.has("Delete workspace") and not page.has("Save role of")

    # A member reads everything and changes nothing (but may still start a workspace of their
    # own).
    page = await (await browser_for(member)).get("/settings")
    assert actions(page) == set()
    for text in ("Olive Owner", "pending@example.com", key["prefix"], "ci agent"):
        assert page.has(text), text
    assert page.has("Create a workspace") and 'action="/settings/workspaces#create"' in page.text


async def test_a_personal_workspace_cannot_be_deleted(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.signup()
    browser = await browser_for(owner)
    page = await browser.get("/settings")
    assert page.has("Personal workspace") and "/settings/delete" not in actions(page)
    page = await browser.post("/settings/delete")
    assert page.status == 400 and page.has("a personal workspace cannot be deleted")
    await api.get(f"/workspaces/{owner.workspace_id}", auth=owner, expect=200)


async def test_every_form_field_has_a_visible_label(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.org(await api.signup())
    await join(api, owner, "member")
    page = await (await browser_for(owner)).get("/settings")
    controls = re.findall(r'<(?:input|select)[^>]*\bid="([^"]+)"', page.text)
    assert len(controls) == len(set(controls)) >= 6  # ids unique across the page's forms
    for control in controls:
        assert re.search(f'<label[^>]* for="{control}">[^<]+', page.text), control


async def test_rename_and_a_bad_slug_shown_by_its_field(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(), "Acme")
    admin = await join(api, owner, "admin")
    browser = await browser_for(admin)
    await browser.get("/settings")
    async with browser.http.post(
        browser.url("/settings/workspace"),
        data={"csrf_token": browser.last.csrf if browser.last else "", "name": "X", "slug": "x1"},
        allow_redirects=False,
    ) as response:
        assert response.status == 303 and response.headers["Location"] == "/settings"
    page = await browser.post("/settings/workspace", {"name": "Acme Labs", "slug": "acme-labs"})
    assert page.url.endswith("/settings") and page.has("Acme Labs")
    workspace = await workspace_of(api, owner)
    assert (workspace["name"], workspace["slug"]) == ("Acme Labs", "acme-labs")

    page = await browser.post("/settings/workspace", {"name": "Renamed", "slug": "Bad Slug!"})
    assert page.status == 422
    error = re.search(r'<p class="error" id="workspace-slug-error">([^<]*)</p>', page.text)
    assert error is not None and "pattern" in error.group(1)
    assert 'value="Bad Slug!"' in page.text  # what was typed, to correct it
    assert 'id="workspace-slug" name="slug" type="text" value="Bad Slug!"' in page.text

    await api.org(await api.signup(), "Taken")
    page = await browser.post("/settings/workspace", {"name": "Renamed", "slug": "taken"})
    assert page.status == 400
    assert 'id="workspace-slug-error">a workspace with this slug already exists' in page.text
    workspace = await workspace_of(api, owner)
    assert (workspace["name"], workspace["slug"]) == ("Acme Labs", "acme-labs")


async def test_an_invitation_shows_its_link_once(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.org(await api.signup(), "Acme")
    browser = await browser_for(owner)
    await browser.get("/settings")
    page = await browser.post("/settings/invites", {"email": "New@Example.com", "role": "admin"})
    assert page.status == 201
    assert page.has("No email server is configured") and page.has("new@example.com")
    links = set(_INVITE_URL.findall(page.text))
    assert len(links) == 1
    link = links.pop()
    assert f'id="invite-link" type="text" value="{link}" readonly' in page.text
    assert 'data-copy="invite-link"' in page.text
    [invite] = await listed(api, owner, "invites")
    assert (invite["email"], invite["role"]) == ("new@example.com", "admin")

    # Listed from now on, never again with its link; the link itself works.
    page = await browser.get("/settings")
    assert page.has("new@example.com") and not _INVITE_URL.search(page.text)
    invited = await browser_for()
    assert (await invited.get(link.removeprefix("http://gateway.test"))).has("Join Acme")


async def test_invitations_that_are_refused(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.org(await api.signup())
    member = await join(api, owner, "member")
    browser = await browser_for(owner)
    await browser.get("/settings")
    page = await browser.post("/settings/invites", {"email": "not an email", "role": "member"})
    assert page.status == 422 and 'id="invite-email-error"' in page.text
    assert 'value="not an email"' in page.text
    page = await browser.post("/settings/invites", {"email": "x@example.com", "role": "owner"})
    assert page.status == 422 and 'id="invite-role-error"' in page.text
    page = await browser.post("/settings/invites", {"email": member.email, "role": "member"})
    assert page.status == 400 and page.has(f"{member.email} is already a member")
    assert await listed(api, owner, "invites") == []


async def test_revoking_an_invitation(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.org(await api.signup())
    invite = await api.invite(owner, "later@example.com")
    browser = await browser_for(owner)
    await browser.get("/settings")
    page = await browser.post(f"/settings/invites/{invite['id']}/revoke")
    assert page.url.endswith("/settings") and not page.has("later@example.com")
    assert await listed(api, owner, "invites") == []
    token = invite["invite_url"].rsplit("/", 1)[1]
    await (await browser_for()).get(f"/invite/{token}", expect=404)


async def test_the_owner_changes_roles_and_removes_members(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup())
    member = await join(api, owner, "member", "Mel Member")
    browser = await browser_for(owner)
    await browser.get("/settings")
    page = await browser.post(f"/settings/members/{member.user_id}/role", {"role": "admin"})
    assert page.url.endswith("/settings")
    assert (await roles_in(api, owner))[member.user_id] == "admin"
    page = await browser.post(f"/settings/members/{member.user_id}/role", {"role": "boss"})
    assert page.status == 422 and page.has("'owner', 'admin' or 'member'")
    assert (await roles_in(api, owner))[member.user_id] == "admin"

    page = await browser.post(f"/settings/members/{member.user_id}/remove")
    assert page.url.endswith("/settings") and not page.has("Mel Member")
    assert member.user_id not in await roles_in(api, owner)


async def test_an_admin_removes_members_but_not_admins(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup())
    admin = await join(api, owner, "admin")
    other_admin = await join(api, owner, "admin")
    member = await join(api, owner, "member")
    browser = await browser_for(admin)
    await browser.get("/settings")
    page = await browser.post(f"/settings/members/{other_admin.user_id}/remove")
    assert page.status == 403 and page.has("admins can only remove members")
    page = await browser.post(f"/settings/members/{member.user_id}/role", {"role": "admin"})
    assert page.status == 403
    page = await browser.post(f"/settings/members/{member.user_id}/remove")
    assert page.url.endswith("/settings")
    assert set(await roles_in(api, owner)) == {owner.user_id, admin.user_id, other_admin.user_id}


async def test_the_last_owner_cannot_be_demoted_or_leave_but_others_may(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup())
    browser = await browser_for(owner)
    page = await browser.get("/settings")
    assert page.has("Leave this workspace")
    page = await browser.post(f"/settings/members/{owner.user_id}/role", {"role": "member"})
    assert page.status == 400 and page.has("a workspace must keep at least one owner")
    assert 'role="alert"' in page.text
    page = await browser.post(f"/settings/members/{owner.user_id}/remove")
    assert page.status == 400 and page.has("a workspace must keep at least one owner")
    assert await roles_in(api, owner) == {owner.user_id: "owner"}

    # With another owner, leaving is allowed: the next page is the home workspace.
    successor = await join(api, owner, "owner")
    page = await browser.post(f"/settings/members/{owner.user_id}/remove")
    assert page.url.endswith("/settings") and page.has("Personal workspace")
    assert await roles_in(api, successor) == {successor.user_id: "owner"}


async def test_an_api_key_is_shown_once_works_and_is_revoked(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup())
    browser = await browser_for(owner)
    await browser.get("/settings")
    page = await browser.post("/settings/api-keys", {"name": "ci agent"})
    assert page.status == 201 and page.has("you will not see it again")
    assert page.headers["Cache-Control"] == "no-store"
    found = re.search(r'<input id="api-key" type="text" value="(mcpg_[^"]+)" readonly', page.text)
    assert found is not None
    key = found.group(1)
    assert '<label for="api-key">' in page.text and 'data-copy="api-key"' in page.text
    assert 'aria-current="page">Settings' in page.text

    page = await browser.get("/settings")
    assert page.has("ci agent") and page.has(key[:12]) and key not in page.text
    await api.get("/servers", auth=key, expect=200)

    [listed_key] = await listed(api, owner, "api-keys")
    page = await browser.post(f"/settings/api-keys/{listed_key['id']}/revoke")
    assert page.url.endswith("/settings") and not page.has("ci agent")
    await api.get("/servers", auth=key, expect=401)
    # Gone for good: revoking again finds nothing.
    page = await browser.post(f"/settings/api-keys/{listed_key['id']}/revoke")
    assert page.status == 404


async def test_an_api_key_needs_a_name(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.org(await api.signup())
    browser = await browser_for(owner)
    await browser.get("/settings")
    page = await browser.post("/settings/api-keys", {"name": "   "})
    assert page.status == 422 and 'id="api-key-name-error"' in page.text
    assert await listed(api, owner, "api-keys") == []


async def test_the_owner_deletes_the_workspace_and_lands_at_home(
    api: Api, browser_for: BrowserFactory
) -> None:
    person = await api.signup(name="Dee")
    owner = await api.org(person, "Doomed")
    browser = await browser_for(owner)
    await browser.get("/settings")
    page = await browser.post("/settings/delete")
    assert page.url.endswith("/") and page.has("Dee's workspace")
    assert not page.has("Doomed")
    await api.get(f"/workspaces/{owner.workspace_id}", auth=person, expect=404)
    page = await browser.get("/settings")
    assert page.has("Personal workspace")


async def test_a_members_posts_are_refused_and_change_nothing(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(), "Acme")
    other = await join(api, owner, "member")
    member = await join(api, owner, "member")
    invite = await api.invite(owner, "pending@example.com")
    await api.api_key(owner, "ci agent")
    [key] = await listed(api, owner, "api-keys")
    before = (
        await workspace_of(api, owner),
        await roles_in(api, owner),
        await listed(api, owner, "invites"),
        await listed(api, owner, "api-keys"),
    )
    browser = await browser_for(member)
    await browser.get("/settings")
    attempts: list[tuple[str, dict[str, str]]] = [
        ("/settings/workspace", {"name": "Mine now", "slug": "mine-now"}),
        ("/settings/delete", {}),
        (f"/settings/members/{member.user_id}/role", {"role": "owner"}),
        (f"/settings/members/{other.user_id}/remove", {}),
        (f"/settings/members/{owner.user_id}/remove", {}),
        ("/settings/invites", {"email": "friend@example.com", "role": "admin"}),
        (f"/settings/invites/{invite['id']}/revoke", {}),
        ("/settings/api-keys", {"name": "my own key"}),
        (f"/settings/api-keys/{key['id']}/revoke", {}),
    ]
    for path, data in attempts:
        page = await browser.post(path, data)
        assert page.status == 403, path
        assert page.has("Not allowed"), path
    after = (
        await workspace_of(api, owner),
        await roles_in(api, owner),
        await listed(api, owner, "invites"),
        await listed(api, owner, "api-keys"),
    )
    assert after == before


async def test_settings_forms_need_their_csrf_token(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.org(await api.signup(), "Acme")
    browser = await browser_for(owner)
    await browser.get("/settings")
    stranger = await browser_for(await api.signup())
    page = await stranger.get("/settings")
    for token in ("", "0" * 64, page.csrf):
        page = await browser.post("/settings/workspace", {"name": "Hijacked"}, csrf=token)
        assert page.status == 403 and page.has("did not come from this site")
        page = await browser.post("/settings/api-keys", {"name": "stolen"}, csrf=token)
        assert page.status == 403
    assert (await workspace_of(api, owner))["name"] == "Acme"
    assert await listed(api, owner, "api-keys") == []


async def test_ids_of_another_workspace_or_malformed_are_not_found(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup())
    elsewhere = await api.org(await api.signup(), "Elsewhere")
    their_member = await join(api, elsewhere, "member")
    their_invite = await api.invite(elsewhere, "theirs@example.com")
    await api.api_key(elsewhere, "theirs")
    [their_key] = await listed(api, elsewhere, "api-keys")
    browser = await browser_for(owner)
    await browser.get("/settings")
    for path, data in [
        (f"/settings/members/{their_member.user_id}/role", {"role": "admin"}),
        (f"/settings/members/{their_member.user_id}/remove", {}),
        (f"/settings/invites/{their_invite['id']}/revoke", {}),
        (f"/settings/api-keys/{their_key['id']}/revoke", {}),
        ("/settings/members/not-a-uuid/role", {"role": "admin"}),
        ("/settings/members/not-a-uuid/remove", {}),
        ("/settings/invites/not-a-uuid/revoke", {}),
        ("/settings/api-keys/not-a-uuid/revoke", {}),
    ]:
        page = await browser.post(path, data)
        assert page.status == 404 and page.has("Not found"), path
    assert (await roles_in(api, elsewhere))[their_member.user_id] == "member"
    assert len(await listed(api, elsewhere, "invites")) == 1
    assert len(await listed(api, elsewhere, "api-keys")) == 1


async def test_hostile_names_are_shown_as_text(api: Api, browser_for: BrowserFactory) -> None:
    hostile = "<script>alert(1)</script>"
    owner = await api.org(await api.signup(name=f"Olive {hostile}"), f"Acme {hostile}")
    await join(api, owner, "member", f"Mel {hostile}")
    browser = await browser_for(owner)
    await browser.get("/settings")
    created = await browser.post("/settings/api-keys", {"name": f"key {hostile}"})
    assert created.status == 201 and created.has(f"key {hostile}")
    page = await browser.get("/settings")
    for text in (f"Olive {hostile}", f"Mel {hostile}", f"key {hostile}", f"Acme {hostile}"):
        assert page.has(text), text
    assert page.has(f"Remove Mel {hostile}") and page.has(f"Revoke key {hostile}")
    for shown in (created, page):
        assert "<script>alert" not in shown.text
    page = await browser.get(f"/settings?workspace_error={hostile}")
    assert not page.has("was not created")  # no message of a stranger's choosing on this page


async def test_creating_a_workspace_from_settings(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.signup()
    browser = await browser_for(owner)
    await browser.get("/settings")
    page = await browser.post("/settings/workspaces", {"name": "   "})
    assert page.status == 422
    assert 'id="create-name-error"' in page.text and 'aria-invalid="true"' in page.text
    page = await browser.post("/settings/workspaces", {"name": "Fresh Start"})
    assert page.url.endswith("/settings") and page.has("Fresh Start")
    assert page.has("Organisation workspace") and page.has("Delete workspace Fresh Start")


async def test_keys_of_a_former_member_are_flagged_beside_their_revoke_button(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(name="Olga"))
    admin = await join(api, owner, "admin", name="Adam")
    theirs = await api.api_key(admin, "adams-agent")
    await api.api_key(owner, "olgas-agent")
    browser = await browser_for(owner)
    page = await browser.get("/settings")
    assert not page.has("former member") and not page.has("no longer a member")

    await api.delete(f"/workspaces/{owner.workspace_id}/members/{admin.user_id}", auth=owner)
    page = await browser.get("/settings")
    assert page.has("1 API key was created by someone who is no longer a member")
    row = re.search(r'<tr>\s*<td data-label="Name">adams-agent</td>.*?</tr>', page.text, re.S)
    assert row is not None and "former member" in row.group(0)
    assert "Revoke adams-agent" in row.group(0)
    other = re.search(r'<tr>\s*<td data-label="Name">olgas-agent</td>.*?</tr>', page.text, re.S)
    assert other is not None and "former member" not in other.group(0)
    # The key still works until an admin revokes it.
    await api.get("/servers", auth=theirs, expect=200)
    [flagged] = [k for k in await listed(api, owner, "api-keys") if k["name"] == "adams-agent"]
    page = await browser.post(f"/settings/api-keys/{flagged['id']}/revoke")
    assert not page.has("no longer a member")
    await api.get("/servers", auth=theirs, expect=401)


async def test_bounds_are_explained_on_their_forms(make_api: AppFactory) -> None:
    api = await make_api(
        max_api_keys_per_workspace=1, max_pending_invites_per_workspace=1, invites_per_hour=2
    )
    owner = await api.org(await api.signup())
    browser = Browser(api)
    try:
        await browser.log_in(owner.email)
        await browser.post("/switch", {"workspace_id": owner.workspace_id}, expect=200)
        await browser.get("/settings")
        assert (await browser.post("/settings/api-keys", {"name": "first"})).status == 201
        await browser.get("/settings")
        page = await browser.post("/settings/api-keys", {"name": "second"})
        assert page.status == 422 and page.has("GATEWAY_MAX_API_KEYS_PER_WORKSPACE")
        assert 'value="second"' in page.text

        invite = {"email": "a@example.com", "role": "member"}
        assert (await browser.post("/settings/invites", invite)).status == 201
        page = await browser.post("/settings/invites", {**invite, "email": "b@example.com"})
        assert page.status == 422 and page.has("GATEWAY_MAX_PENDING_INVITES_PER_WORKSPACE")
        [pending] = await listed(api, owner, "invites")
        await browser.post(f"/settings/invites/{pending['id']}/revoke")
        assert (await browser.post("/settings/invites", invite)).status == 201
        await browser.get("/settings")
        page = await browser.post("/settings/invites", {**invite, "email": "c@example.com"})
        assert page.status == 429 and page.has("GATEWAY_INVITES_PER_HOUR")
        assert int(page.headers["Retry-After"]) > 0
    finally:
        await browser.close()
