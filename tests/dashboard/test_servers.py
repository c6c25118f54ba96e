"""The servers pages: the list and its filters, registering and editing with write-only
credentials, a server's probes, and the playground against a real SDK server."""

from __future__ import annotations

import uuid
from html import unescape

import asyncpg

from tests.helpers.api import Account, Api
from tests.helpers.browser import BrowserFactory
from tests.helpers.proxying import add_server
from tests.helpers.upstreams import fake_upstream, unused_url

HOSTILE = "<script>alert(1)</script>"


async def admin_and_member(api: Api) -> tuple[Account, Account]:
    owner = await api.org(await api.signup(), "Ops")
    return owner, await api.member(owner, "member")


async def test_the_list_with_its_filters(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, member = await admin_and_member(api)
    for name, tags in (("search-prod", ["prod"]), ("fetch-dev", ["dev"])):
        await api.post(
            "/servers",
            json={"name": name, "url": "http://127.0.0.1:9/mcp", "tags": tags},
            auth=owner,
            expect=201,
        )
    await db.execute("UPDATE servers SET status = 'down' WHERE name = 'fetch-dev'")
    browser = await browser_for(member)
    page = await browser.get("/servers")
    assert page.has("search-prod") and page.has("fetch-dev")
    assert not page.has("Register a server")  # a member registers nothing
    assert (await browser.get("/servers?tag=prod")).has("fetch-dev") is False
    assert (await browser.get("/servers?status=down")).has("search-prod") is False
    assert (await browser.get("/servers?search=SEARCH")).has("fetch-dev") is False
    page = await browser.get("/servers?status=sideways")
    assert page.has("Input should be") and not page.has("search-prod")


async def test_register_edit_and_delete_through_the_forms(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, _ = await admin_and_member(api)
    browser = await browser_for(owner)
    await browser.get("/servers/new")
    form = {
        "name": "weather",
        "url": "https://weather.example/mcp",
        "description": "forecasts",
        "tags": "prod, eu , prod",
        "auth_type": "bearer",
        "token": "very-secret-token",
    }
    page = await browser.post("/servers/new", form, expect=200)
    server_id = page.url.rsplit("/", 1)[1]
    assert page.has("weather") and page.has("bearer (credentials stored)")
    row = await db.fetchrow("SELECT tags, auth_type, credentials FROM servers")
    assert row is not None
    assert row["tags"] == ["prod", "eu"] and row["auth_type"] == "bearer"
    assert b"very-secret-token" not in row["credentials"]  # sealed
    # Credentials go in and never come out: not on the server page, not in the edit form.
    for path in (f"/servers/{server_id}", f"/servers/{server_id}/edit", "/servers", "/"):
        assert "very-secret-token" not in (await browser.get(path)).text
    # Renamed, credentials left empty: kept.
    edit = {**form, "name": "weather-eu", "token": ""}
    await browser.post(f"/servers/{server_id}/edit", edit, expect=200)
    row = await db.fetchrow("SELECT name, credentials IS NOT NULL AS sealed FROM servers")
    assert row is not None
    assert (row["name"], row["sealed"]) == ("weather-eu", True)
    # "None" clears them.
    await browser.get(f"/servers/{server_id}/edit")
    await browser.post(f"/servers/{server_id}/edit", {**edit, "auth_type": ""}, expect=200)
    assert await db.fetchval("SELECT credentials FROM servers") is None
    await browser.get(f"/servers/{server_id}")
    page = await browser.post(f"/servers/{server_id}/delete", expect=200)
    assert page.url.endswith("/servers")
    assert await db.fetchval("SELECT count(*) FROM servers") == 0


async def test_an_edit_that_moves_the_server_to_another_host_drops_its_credentials(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    """The form re-sends the auth_type with the token left empty: on the same origin that
    keeps the credentials, on another one they are dropped (they were given for the old host)."""
    owner, _ = await admin_and_member(api)
    browser = await browser_for(owner)
    await browser.get("/servers/new")
    form = {"name": "w", "url": "https://weather.example/mcp", "auth_type": "bearer", "token": "t"}
    server_id = (await browser.post("/servers/new", form, expect=200)).url.rsplit("/", 1)[1]

    async def stored() -> tuple[str | None, bool]:
        row = await db.fetchrow("SELECT auth_type, credentials IS NOT NULL AS sealed FROM servers")
        assert row is not None
        return row["auth_type"], row["sealed"]

    await browser.get(f"/servers/{server_id}/edit")
    same = {**form, "url": "https://weather.example/v2/mcp", "token": ""}
    page = await browser.post(f"/servers/{server_id}/edit", same, expect=200)
    assert page.has("bearer (credentials stored)")
    assert await stored() == ("bearer", True)

    await browser.get(f"/servers/{server_id}/edit")
    moved = {**same, "url": "https://elsewhere.example/mcp"}
    page = await browser.post(f"/servers/{server_id}/edit", moved, expect=200)
    assert not page.has("credentials stored")
    assert await stored() == (None, False)

    # A token typed in with the move is kept.
    await browser.get(f"/servers/{server_id}/edit")
    back = {**moved, "url": "https://weather.example/mcp", "token": "for-weather"}
    page = await browser.post(f"/servers/{server_id}/edit", back, expect=200)
    assert page.has("bearer (credentials stored)")
    assert await stored() == ("bearer", True)


async def test_the_list_shows_every_server_up_to_a_thousand(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, _ = await admin_and_member(api)
    await db.execute(
        "INSERT INTO servers (workspace_id, name, url) "
        "SELECT $1, 'srv-' || lpad(i::text, 3, '0'), 'http://127.0.0.1:9/mcp' "
        "FROM generate_series(1, 120) AS i",
        uuid.UUID(owner.workspace_id),
    )
    page = await (await browser_for(owner)).get("/servers")
    assert page.has("srv-001") and page.has("srv-120")


async def test_bad_input_is_shown_next_to_its_field_and_changes_nothing(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, _ = await admin_and_member(api)
    await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    taken = await db.fetchval("SELECT name FROM servers")
    browser = await browser_for(owner)
    await browser.get("/servers/new")
    page = await browser.post("/servers/new", {"name": "x", "url": "ftp://nope"}, expect=422)
    assert 'id="f-url-error"' in page.text and page.has("http:// or https://")
    assert 'value="ftp://nope"' in page.text  # what was typed stays
    page = await browser.post(
        "/servers/new", {"name": "x", "url": "http://a.example/mcp", "auth_type": "bearer"}
    )
    assert page.status == 422 and 'id="f-token-error"' in page.text
    page = await browser.post(
        "/servers/new",
        {
            "name": "x",
            "url": "http://a.example/mcp",
            "auth_type": "api_key",
            "header_name": "Host",
            "header_value": "v",
        },
    )
    assert page.status == 422 and 'id="f-header_name-error"' in page.text
    page = await browser.post("/servers/new", {"name": taken, "url": "http://a.example/mcp"})
    assert page.status == 400 and page.has("already exists")
    assert await db.fetchval("SELECT count(*) FROM servers") == 1


async def test_a_member_sees_no_edit_controls_and_is_refused(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, member = await admin_and_member(api)
    server_id = await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    browser = await browser_for(member)
    page = await browser.get(f"/servers/{server_id}")
    for control in ("Probe now", "Delete server", "/edit", "Register a server"):
        assert not page.has(control), control
    token = page.csrf
    for path, form in (
        ("/servers/new", {"name": "n", "url": "http://a.example/mcp"}),
        (f"/servers/{server_id}/edit", {"name": "renamed", "url": "http://a.example/mcp"}),
        (f"/servers/{server_id}/delete", {}),
        (f"/servers/{server_id}/probe", {}),
        (f"/servers/{server_id}/tools/invoke", {"tool_name": "echo", "arguments": "{}"}),
        (f"/servers/{server_id}/tools/refresh", {}),
    ):
        refused = await browser.post(path, form, csrf=token)
        assert refused.status == 403, path
        assert refused.has("requires the admin role")
    for path in ("/servers/new", f"/servers/{server_id}/edit"):
        assert (await browser.get(path, expect=403)).has("requires the admin role")
    assert await db.fetchval("SELECT count(*) FROM servers") == 1
    assert await db.fetchval("SELECT count(*) FROM health_checks") == 0


async def test_other_workspaces_servers_do_not_exist(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, _ = await admin_and_member(api)
    stranger = await api.signup()
    theirs = await add_server(api, db, stranger, "http://127.0.0.1:9/mcp")
    browser = await browser_for(owner)
    token = (await browser.get("/servers")).csrf
    for path in (f"/servers/{theirs}", f"/servers/{theirs}/edit", f"/servers/{theirs}/tools",
                 "/servers/not-a-uuid", f"/servers/{uuid.uuid4()}"):  # fmt: skip
        assert (await browser.get(path, expect=404)).has("server not found"), path
    for path in (f"/servers/{theirs}/delete", f"/servers/{theirs}/probe"):
        assert (await browser.post(path, csrf=token)).status == 404
    assert await db.fetchval("SELECT count(*) FROM servers") == 1


async def test_hostile_names_are_escaped(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, _ = await admin_and_member(api)
    await api.post(
        "/servers",
        json={
            "name": HOSTILE,
            "url": "http://127.0.0.1:9/mcp",
            "description": HOSTILE,
            "tags": [HOSTILE],
        },
        auth=owner,
        expect=201,
    )
    server_id = await db.fetchval("SELECT id FROM servers")
    browser = await browser_for(owner)
    for path in ("/", "/servers", f"/servers/{server_id}", f"/servers/{server_id}/edit"):
        page = await browser.get(path)
        assert HOSTILE not in page.text and "&lt;script&gt;" in page.text, path


async def test_probe_now_shows_the_probe(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory, sdk_stateless: str
) -> None:
    owner, _ = await admin_and_member(api)
    healthy = await add_server(api, db, owner, sdk_stateless)
    down = await add_server(api, db, owner, unused_url())
    browser = await browser_for(owner)
    await browser.get(f"/servers/{healthy}")
    page = await browser.post(f"/servers/{healthy}/probe", expect=200)
    assert page.has("1 probe stored") and page.has("healthy")
    await browser.get(f"/servers/{down}")
    page = await browser.post(f"/servers/{down}/probe", expect=200)
    assert page.has("down") and page.has("connection refused")  # the probe's error, shown


async def test_the_playground_lists_and_calls_tools(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory, sdk_stateless: str
) -> None:
    owner, member = await admin_and_member(api)
    server_id = await add_server(api, db, owner, sdk_stateless)
    viewer = await browser_for(member)
    page = await viewer.get(f"/servers/{server_id}/tools")
    assert page.has("Add two integers.") and page.has("Return the text unchanged.")
    assert not page.has("Call echo") and page.has("needs the admin role")
    browser = await browser_for(owner)
    page = await browser.get(f"/servers/{server_id}/tools")
    assert page.has('"a": 0')  # the arguments to start from, from the schema
    page = await browser.post(
        f"/servers/{server_id}/tools/invoke",
        {"tool_name": "echo", "arguments": '{"text": "hello <b>you</b>"}'},
        expect=200,
    )
    assert "badge call-success" in page.text and page.has("hello <b>you</b>")
    assert "<b>you</b>" not in page.text
    row = await db.fetchrow("SELECT tool_name, caller_agent, status FROM tool_calls")
    assert row is not None
    assert tuple(row) == ("echo", "mcp-gateway-playground", "success")
    failed = await browser.post(
        f"/servers/{server_id}/tools/invoke", {"tool_name": "fail", "arguments": "{}"}
    )
    assert failed.status == 200 and "badge call-error" in failed.text
    assert failed.has("Error executing")


async def test_playground_input_errors_are_next_to_the_arguments(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory, sdk_stateless: str
) -> None:
    owner, _ = await admin_and_member(api)
    server_id = await add_server(api, db, owner, sdk_stateless)
    browser = await browser_for(owner)
    await browser.get(f"/servers/{server_id}/tools")
    for arguments, message in (
        ("{not json", "not valid JSON"),
        ('{"a": NaN, "b": 1}', "not valid JSON"),  # standard JSON only, as in the API
        ("[" * 100_000, "not valid JSON"),  # too deep: refused, not a crash
        ("[1, 2]", "dictionary"),
        ('{"a": "x"}', 'a: "x" is not of type "integer"'),
    ):
        page = await browser.post(
            f"/servers/{server_id}/tools/invoke", {"tool_name": "add", "arguments": arguments}
        )
        assert page.status == 422, arguments
        error = page.text.split('class="error" id="args-error-1">', 1)[1].split("</p>", 1)[0]
        assert message in unescape(error)
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 0  # nothing called


async def test_the_playground_shows_a_failing_server_and_hostile_tools_escaped(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, _ = await admin_and_member(api)
    browser = await browser_for(owner)
    gone = await add_server(api, db, owner, unused_url())
    page = await browser.get(f"/servers/{gone}/tools")
    assert page.has("The tool list could not be fetched") and page.has("connection refused")
    tools = [
        {"name": "x", "description": HOSTILE, "inputSchema": {"type": "object"}},
        # A server's schema may hold anything: the page still renders.
        {"name": "odd", "description": "", "inputSchema": {"type": "object", "required": [["a"]],
         "properties": {"a": {"type": ["string", "null"]}, "b": "not a schema"}}},
    ]  # fmt: skip
    async with fake_upstream(tools=tools) as upstream:
        hostile = await add_server(api, db, owner, upstream.url)
        page = await browser.get(f"/servers/{hostile}/tools")
    assert HOSTILE not in page.text and page.has(HOSTILE)
    assert page.has("string or null")
