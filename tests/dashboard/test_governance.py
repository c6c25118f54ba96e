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


async def server_of(api: Api, owner: Account, server_id: str) -> dict[str, Any]:
    reply = await api.get(f"/servers/{server_id}", auth=owner, expect=200)
    server: dict[str, Any] = reply.body
    return server


async def test_an_admin_disables_tools_with_the_picker_and_sets_a_rate_limit(
    api: Api, browser_for: BrowserFactory, sdk_stateless: str
) -> None:
    owner = await api.org(await api.signup(), "Rules")
    admin = await api.member(owner, "admin")
    server_id = await add_server(api, owner, "sdk", sdk_stateless)
    browser = await browser_for(admin)
    page = await browser.get(f"/servers/{server_id}")
    assert f'href="/servers/{server_id}/rules"' in page.text and page.has("Rate limit")
    page = await browser.get(f"/servers/{server_id}/rules")
    for tool in ("add", "echo", "fail", "slow"):
        assert f'name="disabled_tool" value="{tool}">' in page.text, tool

    page = await browser.post(
        f"/servers/{server_id}/rules",
        [
            ("disabled_tool", "fail"),
            ("disabled_tool", "add"),
            ("disabled_patterns", "sl*\n\n fail \nnot_listed_yet"),
            ("rate_limit", "50/minute"),
        ],
        expect=200,
    )
    assert page.url.endswith(f"/servers/{server_id}") and page.has("50/minute")
    server = await server_of(api, owner, server_id)
    assert server["disabled_tools"] == ["fail", "add", "sl*", "not_listed_yet"]
    assert server["rate_limit"] == "50/minute"

    # The form shows them again: listed names as checked boxes, the rest as lines.
    page = await browser.get(f"/servers/{server_id}/rules")
    assert 'value="fail" checked' in page.text and 'value="add" checked' in page.text
    assert 'value="echo" checked' not in page.text
    assert page.has(">sl*\nnot_listed_yet</textarea>") and page.has("disabled by a pattern")
    assert 'value="50/minute"' in page.text

    # The playground marks them, and calling one shows the refusal (logged as refused).
    page = await browser.get(f"/servers/{server_id}/tools")
    assert page.text.count('class="badge tool-disabled">disabled<') == 3  # add, fail, slow
    page = await browser.post(
        f"/servers/{server_id}/tools/invoke", {"tool_name": "fail", "arguments": "{}"}
    )
    assert page.status == 403 and 'role="alert"' in page.text
    assert page.has("tool 'fail' is disabled on this server")
    assert page.has("Call fail")  # the playground, not an error page
    page = await browser.post(
        f"/servers/{server_id}/tools/invoke", {"tool_name": "echo", "arguments": '{"text": "hi"}'}
    )
    assert page.status == 200 and page.has("call-success")
    page = await browser.get("/tool-calls?refused=true")
    assert page.has("call-refused") and page.has("fail") and not page.has(">echo<")

    # Unchecking everything and emptying the fields removes the rules.
    await browser.get(f"/servers/{server_id}/rules")
    await browser.post(f"/servers/{server_id}/rules", [("rate_limit", "")], expect=200)
    server = await server_of(api, owner, server_id)
    assert server["disabled_tools"] == [] and server["rate_limit"] is None


async def test_bad_tool_rules_are_shown_on_the_form_and_change_nothing(
    api: Api, browser_for: BrowserFactory, sdk_stateless: str
) -> None:
    owner = await api.org(await api.signup(), "Rules")
    server_id = await add_server(api, owner, "sdk", sdk_stateless)
    await api.patch(
        f"/servers/{server_id}",
        json={"disabled_tools": ["fail"], "rate_limit": "5/second"},
        auth=owner,
        expect=200,
    )
    before = await server_of(api, owner, server_id)
    browser = await browser_for(owner)
    await browser.get(f"/servers/{server_id}/rules")
    cases = [
        ([("rate_limit", "fast")], "must be 'N/second', 'N/minute', 'N/hour' or 'N/day'"),
        ([("disabled_patterns", "ok_*\nwrite_{a,b}")], "write_{a,b}: only * (any characters)"),
        ([("disabled_tool", "x" * 300)], "at most 255 characters"),
    ]
    for fields, message in cases:
        page = await browser.post(f"/servers/{server_id}/rules", fields)
        assert page.status == 422 and page.has(message), (fields, page.text[-2000:])
        assert 'aria-invalid="true"' in page.text
        for name, value in fields:
            if name != "disabled_tool":
                assert page.has(value), (fields, value)  # as typed, ready to correct
        assert await server_of(api, owner, server_id) == before


async def test_a_server_whose_tools_cannot_be_read_gets_the_textarea(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(), "Rules")
    server_id = await add_server(api, owner, "gone")  # nothing listens there
    browser = await browser_for(owner)
    page = await browser.get(f"/servers/{server_id}/rules")
    assert page.has("The tool list could not be read") and 'name="disabled_tool"' not in page.text
    await browser.post(
        f"/servers/{server_id}/rules",
        [("disabled_patterns", "drop_*\ndelete_all"), ("rate_limit", "1/day")],
        expect=200,
    )
    server = await server_of(api, owner, server_id)
    assert server["disabled_tools"] == ["drop_*", "delete_all"] and server["rate_limit"] == "1/day"
    page = await browser.get(f"/servers/{server_id}/rules")
    assert page.has(">drop_*\ndelete_all</textarea>")


async def test_members_see_the_rules_but_cannot_change_them(
    api: Api, browser_for: BrowserFactory, sdk_stateless: str
) -> None:
    owner = await api.org(await api.signup(), "Rules")
    server_id = await add_server(api, owner, "sdk", sdk_stateless)
    await api.patch(
        f"/servers/{server_id}", json={"disabled_tools": ["fail"]}, auth=owner, expect=200
    )
    before = await server_of(api, owner, server_id)
    browser = await browser_for(await api.member(owner, "member"))
    page = await browser.get(f"/servers/{server_id}")
    assert page.has("Disabled tools") and page.has("fail")
    assert f"/servers/{server_id}/rules" not in page.text
    await browser.get(f"/servers/{server_id}/rules", expect=403)
    await browser.post(f"/servers/{server_id}/rules", [("rate_limit", "1/day")], expect=403)
    page = await browser.get(f"/servers/{server_id}/tools")
    assert page.has("disabled") and "/tools/invoke" not in page.text
    assert await server_of(api, owner, server_id) == before
