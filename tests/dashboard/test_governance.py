"""Governed access in the dashboard: API key scopes in Settings, a server's tool rules with
their tool picker, disabled tools in the playground; admins edit, members only read."""

from __future__ import annotations

from typing import Any

from tests.helpers.alerting import add_server
from tests.helpers.api import Account, Api
from tests.helpers.browser import BrowserFactory


async def keys_of(api: Api, owner: Account) -> dict[str, dict[str, Any]]:
    reply = await api.get(f"/workspaces/{owner.workspace_id}/api-keys", auth=owner, expect=200)
    return {key["name"]: key for key in reply.body}


async def test_an_admin_creates_a_key_with_a_scope_and_edits_it(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(), "Scopes")
    admin = await api.member(owner, "admin")
    docs = await add_server(api, owner, "docs")
    search = await add_server(api, owner, "search")
    browser = await browser_for(admin)
    page = await browser.get("/settings")
    assert page.has("docs") and page.has("search")  # the create form's server checkboxes

    page = await browser.post(
        "/settings/api-keys",
        [
            ("name", "reader"),
            ("scope", "1"),
            ("permissions", "proxy"),
            ("permissions", "read"),
            ("servers", "only"),
            ("allowed_servers", docs),
            ("allowed_servers", search),
            ("allowed_tools", "read_*\n\n  get_page \n"),
            ("rate_limit", "100/minute"),
        ],
        expect=201,
    )
    assert page.has("mcpg_")  # the value, shown once
    key = (await keys_of(api, owner))["reader"]
    assert key["permissions"] == ["proxy", "read"]
    assert sorted(key["allowed_servers"]) == sorted([docs, search])
    assert key["allowed_tools"] == ["read_*", "get_page"]
    assert key["rate_limit"] == "100/minute"
    page = await browser.get("/settings")
    assert page.has("proxy, read · 2 servers · read_*, get_page · 100/minute")
    assert f'href="/settings/api-keys/{key["id"]}/edit"' in page.text

    # The edit page shows the scope as stored, and saving it changes what the API shows.
    page = await browser.get(f"/settings/api-keys/{key['id']}/edit")
    assert f'value="{docs}" checked' in page.text and 'value="only" checked' in page.text
    assert 'value="ingest" checked' not in page.text and page.has("read_*\nget_page")
    await browser.post(
        f"/settings/api-keys/{key['id']}/edit",
        [
            ("name", "reader"),
            ("scope", "1"),
            ("permissions", "proxy"),
            ("permissions", "ingest"),
            ("permissions", "read"),
            ("servers", "all"),
            ("allowed_tools", ""),
            ("rate_limit", " 5/second "),
        ],
        expect=200,
    )
    key = (await keys_of(api, owner))["reader"]
    assert key["permissions"] == ["proxy", "ingest", "read"]
    assert key["allowed_servers"] is None and key["allowed_tools"] is None
    assert key["rate_limit"] == "5/second"
    page = await browser.get("/settings")
    assert page.has("5/second") and not page.has("2 servers")

    # "Only" with nothing checked is no server at all; no permission is a key that does nothing.
    await browser.get(f"/settings/api-keys/{key['id']}/edit")
    await browser.post(
        f"/settings/api-keys/{key['id']}/edit",
        [("name", "reader"), ("scope", "1"), ("servers", "only"), ("rate_limit", "")],
        expect=200,
    )
    key = (await keys_of(api, owner))["reader"]
    assert key["permissions"] == [] and key["allowed_servers"] == []
    assert key["rate_limit"] is None
    assert (await browser.get("/settings")).has("no permissions · no servers")

    # A form without the scope's fields (the marker) changes the name only.
    await browser.post(f"/settings/api-keys/{key['id']}/edit", [("name", "renamed")], expect=200)
    renamed = (await keys_of(api, owner))["renamed"]
    assert renamed["permissions"] == [] and renamed["allowed_servers"] == []

    # An unrestricted key says so.
    await api.api_key(owner, "everything-key")
    page = await browser.get("/settings")
    assert '<td data-label="Scope" class="scope-summary">everything</td>' in page.text


async def test_bad_scopes_are_shown_on_the_form_and_change_nothing(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(), "Scopes")
    docs = await add_server(api, owner, "docs")
    await api.post(
        f"/workspaces/{owner.workspace_id}/api-keys",
        json={"name": "agent", "allowed_tools": ["read_*"], "rate_limit": "10/minute"},
        auth=owner,
        expect=201,
    )
    before = (await keys_of(api, owner))["agent"]
    browser = await browser_for(owner)
    edit = f"/settings/api-keys/{before['id']}/edit"
    await browser.get(edit)

    cases: list[tuple[list[tuple[str, str]], str]] = [
        ([("rate_limit", "lots")], "must be 'N/second', 'N/minute', 'N/hour' or 'N/day'"),
        ([("rate_limit", "0/minute")], "must allow at least 1 call per window"),
        ([("allowed_tools", "read_*\nwrite_[ab]")], "write_[ab]: only * (any characters)"),
        ([("permissions", "admin")], "Input should be 'proxy', 'ingest' or 'read'"),
        ([("servers", "all"), ("allowed_servers", docs)], 'choose "Only the servers checked"'),
        ([("servers", "only"), ("allowed_servers", "not-an-id")], "valid UUID"),
        # A server of another workspace, or deleted since the page was shown: the API's 422.
        (
            [("servers", "only"), ("allowed_servers", "00000000-0000-7000-8000-000000000000")],
            "not servers of this workspace",
        ),
        ([("name", "")], "at least 1 character"),
    ]
    for change, message in cases:
        form = {"name": "agent", "scope": "1", "permissions": "proxy", "allowed_tools": "read_*"}
        fields = [(k, v) for k, v in form.items() if k not in {c[0] for c in change}]
        page = await browser.post(edit, [*fields, *change])
        assert page.status == 422, (change, page.status)
        assert page.has(message), (change, page.text[-3000:])
        assert 'aria-invalid="true"' in page.text or 'class="alert error"' in page.text
        # What was typed is shown again, ready to correct.
        for name, value in change:
            if name in ("rate_limit", "name") and value:
                assert f'value="{value}"' in page.text, change
        assert (await keys_of(api, owner))["agent"] == before, change

    # The create form shows its errors the same way, and creates nothing.
    await browser.get("/settings")
    page = await browser.post(
        "/settings/api-keys",
        [("name", "new one"), ("scope", "1"), ("rate_limit", "9/fortnight")],
        expect=422,
    )
    assert page.has("must be 'N/second'") and page.has('value="9/fortnight"')
    assert '<details class="scope-details" open>' in page.text
    assert set(await keys_of(api, owner)) == {"agent"}


async def test_members_see_no_scope_controls_and_their_posts_are_refused(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(), "Scopes")
    await add_server(api, owner, "docs")
    await api.api_key(owner, "agent")
    before = (await keys_of(api, owner))["agent"]
    member = await api.member(owner, "member")
    browser = await browser_for(member)
    page = await browser.get("/settings")
    assert page.has("agent") and page.has("everything")  # the scope, read only
    assert "/edit" not in page.text and 'name="allowed_tools"' not in page.text
    edit = f"/settings/api-keys/{before['id']}/edit"
    page = await browser.get(edit, expect=403)
    change = [("name", "agent"), ("scope", "1"), ("rate_limit", "1/day")]
    page = await browser.post(edit, change, expect=403)
    page = await browser.post("/settings/api-keys", [("name", "mine")], expect=403)
    assert await keys_of(api, owner) == {"agent": before}
