"""The toolsets pages: the list, creating and editing through the form (ordered servers, prefixes,
the tool picker), errors next to their server, a toolset's exposed tools and its "Connect an
agent" panel; admins edit, members only read, other workspaces see nothing."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import asyncpg

from gateway.dashboard.connect import KEY_PLACEHOLDER, snippets
from tests.helpers.alerting import add_server
from tests.helpers.api import Account, Api
from tests.helpers.browser import BrowserFactory
from tests.helpers.upstreams import unused_url

HOSTILE = "<script>alert(1)</script>"


async def toolset_of(api: Api, owner: Account, toolset_id: str) -> dict[str, Any]:
    body: dict[str, Any] = (await api.get(f"/toolsets/{toolset_id}", auth=owner, expect=200)).body
    return body


def error_of(html: str, field_id: str) -> str:
    """The error shown under a field of the form."""
    found = re.search(rf'id="{field_id}-error">([^<]*)<', html)
    assert found is not None, f"no error for #{field_id}"
    return unescape(found.group(1))


def shown(html: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</(?:code|pre)>', html, re.DOTALL)
    assert found is not None, f"no #{element_id} on the page"
    return unescape(found.group(1))


async def test_an_admin_creates_edits_and_deletes_a_toolset_through_the_form(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(), "Ops")
    github = await add_server(api, owner, "GitHub Tools")
    files = await add_server(api, owner, "files")
    await add_server(api, owner, "left out")
    browser = await browser_for(owner)
    page = await browser.get("/toolsets")
    assert page.has("No toolsets yet") and page.has("New toolset")
    page = await browser.get("/toolsets/new")
    # Every server is offered, each with its default prefix written out.
    assert page.has("GitHub Tools") and page.has("left out")
    assert f'name="prefix.{github}" type="text" value="github_tools__"' in page.text

    page = await browser.post(
        "/toolsets/new",
        [
            ("name", "Coding"),
            ("description", "for the coding agent"),
            ("member", github),
            ("member", files),
            ("position." + github, "2"),
            ("position." + files, "1"),
            ("prefix." + github, "github_tools__"),  # the default, as shown: stays the default
            ("prefix." + files, ""),  # no prefix
            ("patterns." + files, "read_*\n\n list_dir \nread_*"),
        ],
        expect=200,
    )
    toolset_id = page.url.rsplit("/", 1)[1]
    assert page.has("Coding") and page.has("Connect an agent")
    toolset = await toolset_of(api, owner, toolset_id)
    assert toolset["description"] == "for the coding agent"
    assert toolset["servers"] == [
        {"server_id": files, "tools": ["read_*", "list_dir"], "prefix": ""},
        {"server_id": github, "tools": None, "prefix": None},
    ]
    assert (await browser.get("/toolsets")).has("Coding")

    # The edit form shows it as stored; a new order and a prefix of its own.
    page = await browser.get(f"/toolsets/{toolset_id}/edit")
    order = re.search(rf'name="position.{files}"[^>]* value="([^"]*)"', page.text)
    assert order is not None and order.group(1) == "1"
    assert page.has("read_*\nlist_dir")
    await browser.post(
        f"/toolsets/{toolset_id}/edit",
        [
            ("name", "Coding"),
            ("member", github),
            ("member", files),
            ("position." + github, "1"),
            ("position." + files, ""),  # no order: after the numbered ones
            ("prefix." + github, "gh-"),
            ("prefix." + files, ""),
        ],
        expect=200,
    )
    toolset = await toolset_of(api, owner, toolset_id)
    assert toolset["description"] == ""
    assert toolset["servers"] == [
        {"server_id": github, "tools": None, "prefix": "gh-"},
        {"server_id": files, "tools": None, "prefix": ""},
    ]

    await browser.get(f"/toolsets/{toolset_id}")
    page = await browser.post(f"/toolsets/{toolset_id}/delete", expect=200)
    assert page.url.endswith("/toolsets")
    assert await db.fetchval("SELECT count(*) FROM toolsets") == 0
    assert await db.fetchval("SELECT count(*) FROM servers") == 3


async def test_refused_values_are_shown_next_to_their_server_and_change_nothing(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner = await api.signup()
    one = await add_server(api, owner, "one")
    two = await add_server(api, owner, "two")
    await api.post("/toolsets", json={"name": "taken"}, auth=owner, expect=201)
    browser = await browser_for(owner)
    await browser.get("/toolsets/new")
    form = [
        ("name", "new"),
        ("member", one),
        ("member", two),
        ("prefix." + one, "one."),
        ("patterns." + two, "fine\nread_[ab]"),
    ]
    page = await browser.post("/toolsets/new", form, expect=422)
    assert error_of(page.text, f"prefix-{one}").startswith("may hold only letters, digits, _")
    assert error_of(page.text, f"patterns-{two}").startswith("read_[ab]: only * (any characters)")
    assert f'id="prefix-{two}-error"' not in page.text  # only the field refused is marked
    # What was typed is kept.
    assert 'value="one."' in page.text and page.has("fine\nread_[ab]")

    page = await browser.post(
        "/toolsets/new",
        [("name", "new"), ("member", one), ("position." + one, "first")],
        expect=422,
    )
    assert error_of(page.text, f"order-{one}") == "a whole number, e.g. 1"
    page = await browser.post("/toolsets/new", [("name", "taken")], expect=400)
    assert page.has("a toolset with this name already exists in this workspace")
    page = await browser.post("/toolsets/new", [("name", " ")], expect=422)
    assert page.has("String should have at least 1 character")
    assert await db.fetchval("SELECT count(*) FROM toolsets") == 1


async def test_the_edit_form_offers_each_member_s_tools_to_pick(
    api: Api, browser_for: BrowserFactory, sdk_stateless: str
) -> None:
    owner = await api.signup()
    sdk = await add_server(api, owner, "sdk", sdk_stateless)
    await api.patch(f"/servers/{sdk}", json={"disabled_tools": ["fail"]}, auth=owner, expect=200)
    dead = await add_server(api, owner, "dead", unused_url())
    other = await add_server(api, owner, "not a member")
    created = await api.post(
        "/toolsets",
        json={
            "name": "picked",
            "servers": [{"server_id": sdk, "tools": ["echo", "re*"]}, {"server_id": dead}],
        },
        auth=owner,
        expect=201,
    )
    toolset_id = created.body["id"]
    browser = await browser_for(owner)
    page = await browser.get(f"/toolsets/{toolset_id}/edit")
    for tool in ("add", "echo", "fail"):
        assert f'name="tool.{sdk}" value="{tool}"' in page.text
    assert f'name="tool.{sdk}" value="echo" checked' in page.text
    assert f'name="tool.{sdk}" value="add">' in page.text  # not checked
    assert page.has("disabled on the server")
    # A pattern that is no tool's name stays a line of text; the dead member says why.
    assert re.search(rf'name="patterns.{sdk}"[^>]*>re\*</textarea>', page.text)
    assert page.has("Its tool list could not be read: cannot list the server's tools")
    assert f'name="tool.{other}"' not in page.text

    await browser.post(
        f"/toolsets/{toolset_id}/edit",
        [
            ("name", "picked"),
            ("member", sdk),
            ("member", dead),
            ("position." + sdk, "1"),
            ("position." + dead, "2"),
            ("tool." + sdk, "add"),
            ("tool." + sdk, "echo"),
            ("patterns." + sdk, ""),
            ("prefix." + sdk, ""),
        ],
        expect=200,
    )
    toolset = await toolset_of(api, owner, toolset_id)
    assert toolset["servers"][0] == {"server_id": sdk, "tools": ["add", "echo"], "prefix": ""}
    assert toolset["servers"][1]["tools"] is None


async def test_the_toolset_page_shows_its_tools_conflicts_and_how_to_connect(
    api: Api, browser_for: BrowserFactory, sdk_stateless: str, sdk_stateful: str
) -> None:
    owner = await api.signup()
    first = await add_server(api, owner, "first", sdk_stateless)
    second = await add_server(api, owner, "second", sdk_stateful)
    dead = await add_server(api, owner, "dead", unused_url())
    created = await api.post(
        "/toolsets",
        json={
            "name": f"Research {HOSTILE}",
            "servers": [
                {"server_id": first, "tools": ["add", "echo"]},
                {"server_id": second, "tools": ["echo"], "prefix": "first__"},
                {"server_id": dead},
            ],
        },
        auth=owner,
        expect=201,
    )
    toolset = created.body
    key = await api.api_key(owner)
    page = await (await browser_for(owner)).get(f"/toolsets/{toolset['id']}")
    assert HOSTILE not in page.text and page.has(f"Research {HOSTILE}")  # escaped
    assert page.has("first__add") and page.has("first__echo") and page.has("Add two integers.")
    assert page.has("Left out: the same name as an earlier server's tool")
    assert page.has("The tools of dead could not be listed, so they are left out")
    assert page.has("2 tools.")
    assert page.text.count("(default)") == 2  # first and dead: the prefix made from the name

    url = toolset["url"]
    assert url == f"http://gateway.test/api/v1/toolsets/{toolset['id']}/mcp"
    assert shown(page.text, "connect-url") == url
    assert shown(page.text, "connect-header") == f"Authorization: Bearer {KEY_PLACEHOLDER}"
    for snippet in snippets(toolset["name"], url):
        assert shown(page.text, snippet.id) == snippet.text
    assert key not in page.text and key[:12] not in page.text


async def test_members_read_and_never_see_edit_controls(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(), "Ops")
    member = await api.member(owner, "member")
    server = await add_server(api, owner, "s")
    created = await api.post(
        "/toolsets", json={"name": "shared", "servers": [{"server_id": server}]}, auth=owner
    )
    toolset_id = created.body["id"]
    browser = await browser_for(member)
    page = await browser.get("/toolsets")
    assert page.has("shared") and not page.has("New toolset")
    page = await browser.get(f"/toolsets/{toolset_id}")
    assert page.has("Connect an agent") and not page.has("Delete toolset")
    assert f'href="/toolsets/{toolset_id}/edit"' not in page.text
    await browser.get("/toolsets/new", expect=403)
    await browser.get(f"/toolsets/{toolset_id}/edit", expect=403)
    await browser.post("/toolsets/new", [("name", "mine")], expect=403)
    await browser.post(f"/toolsets/{toolset_id}/edit", [("name", "mine")], expect=403)
    await browser.post(f"/toolsets/{toolset_id}/delete", expect=403)
    assert await db.fetchval("SELECT name FROM toolsets") == "shared"


async def test_another_workspace_s_toolset_is_a_404_page(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner = await api.signup()
    created = await api.post("/toolsets", json={"name": "private"}, auth=owner, expect=201)
    toolset_id = created.body["id"]
    stranger = await browser_for(await api.org(await api.signup(), "Elsewhere"))
    for path in (f"/toolsets/{toolset_id}", f"/toolsets/{toolset_id}/edit", "/toolsets/nope"):
        page = await stranger.get(path, expect=404)
        assert page.has("toolset not found") and not page.has("private")
    assert not (await stranger.get("/toolsets")).has("private")
    await stranger.post(f"/toolsets/{toolset_id}/edit", [("name", "taken")], expect=404)
    await stranger.post(f"/toolsets/{toolset_id}/delete", expect=404)
    assert await db.fetchval("SELECT name FROM toolsets") == "private"
