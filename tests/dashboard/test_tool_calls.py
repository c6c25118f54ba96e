"""The tool-call log pages: every filter of GET /tool-calls (the toolset's too), pages of 50,
one call's details."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from html import unescape
from typing import Any

import asyncpg

from tests.helpers.api import Account, Api
from tests.helpers.browser import BrowserFactory
from tests.helpers.proxying import add_server
from tests.helpers.toolset_calls import add_toolset, write_calls

HOSTILE = "<img src=x onerror=alert(1)>"


async def ingest(api: Api, key: str, server_id: str, count: int, **fields: Any) -> None:
    body = [{"server_id": server_id, "tool_name": "search", "status": "success", **fields}] * count
    await api.post("/tool-calls", json=body, auth=key, expect=201)


def rows(text: str) -> int:
    return len(re.findall(r'<a href="/tool-calls/[0-9a-f-]{36}">', text))


async def arrange(api: Api, db: asyncpg.Connection) -> tuple[Account, str, str, str]:
    owner = await api.org(await api.signup(), "Calls")
    key = await api.api_key(owner)
    first = await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    second = await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    return owner, key, first, second


async def test_every_filter_of_the_log(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, key, first, second = await arrange(api, db)
    # Within the retention (30 days): three days ago, and a day later as a bound between.
    early = datetime.now(UTC).replace(hour=10, minute=0, second=0, microsecond=0)
    early -= timedelta(days=3)
    between = f"{early + timedelta(days=1):%Y-%m-%dT%H:%M}"
    await ingest(api, key, first, 3, tool_name="search", caller_agent="agent-a")
    await ingest(api, key, first, 2, tool_name="fetch", status="error", error_message="boom")
    await ingest(api, key, second, 1, tool_name="search", created_at=early.isoformat())
    browser = await browser_for(await api.member(owner, "member"))
    page = await browser.get("/tool-calls")
    assert rows(page.text) == 6 and page.has("6 calls")
    assert rows((await browser.get(f"/tool-calls?server_id={second}")).text) == 1
    assert rows((await browser.get("/tool-calls?tool_name=FET")).text) == 2
    assert rows((await browser.get("/tool-calls?caller_agent=agent-a")).text) == 3
    page = await browser.get("/tool-calls?status=error")
    assert rows(page.text) == 2 and page.has("boom")
    assert rows((await browser.get(f"/tool-calls?end={between}")).text) == 1
    assert rows((await browser.get(f"/tool-calls?start={between}")).text) == 5
    page = await browser.get("/tool-calls?start=2026-01-02T00:00&end=2026-01-01T00:00")
    assert rows(page.text) == 0 and page.has("end must not be before start")
    page = await browser.get("/tool-calls?start=yesterday")
    assert rows(page.text) == 0 and 'class="error"' in page.text


async def test_pages_of_fifty(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, key, first, _ = await arrange(api, db)
    await ingest(api, key, first, 120, status="error")
    browser = await browser_for(owner)
    page = await browser.get("/tool-calls?status=error")
    assert rows(page.text) == 50 and page.has("1\u201350 of 120")
    assert not page.has("Newer")
    page = await browser.get("/tool-calls?status=error&offset=100")
    assert rows(page.text) == 20 and page.has("101\u2013120 of 120")
    assert page.has("Newer") and not page.has("Older")
    assert 'href="/tool-calls?status=error&amp;offset=50"' in page.text


async def test_one_calls_details_and_other_workspaces_calls(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, key, first, _ = await arrange(api, db)
    await ingest(
        api, key, first, 1, tool_name=HOSTILE, caller_agent=HOSTILE, error_message=HOSTILE,
        status="error", duration_ms=1234, input_tokens=5, output_tokens=7, output_size_bytes=99,
    )  # fmt: skip
    call_id = await db.fetchval("SELECT id FROM tool_calls")
    browser = await browser_for(owner)
    listed = await browser.get("/tool-calls")
    page = await browser.get(f"/tool-calls/{call_id}")
    for shown in (listed, page):
        assert HOSTILE not in shown.text and shown.has(HOSTILE)
    assert page.has("1,234 ms") and page.has("99 bytes")
    stranger = await api.signup()
    theirs = await add_server(api, db, stranger, "http://127.0.0.1:9/mcp")
    await ingest(api, await api.api_key(stranger), theirs, 1)
    their_call = await db.fetchval(
        "SELECT id FROM tool_calls WHERE server_id = $1", uuid.UUID(theirs)
    )
    for path in (f"/tool-calls/{their_call}", "/tool-calls/nope", f"/tool-calls/{uuid.uuid4()}"):
        assert (await browser.get(path, expect=404)).has("tool call not found")
    # And another workspace's calls are not in this log.
    assert rows((await browser.get("/tool-calls")).text) == 1


async def test_the_list_shows_the_time_zone_the_filters_take(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    """UTC on both sides, labelled: a call listed at 10:30 UTC is found from 10:30 on and not
    from 10:31 on."""
    owner, key, first, _ = await arrange(api, db)
    moment = datetime.now(UTC).replace(hour=10, minute=30, second=0, microsecond=0)
    moment -= timedelta(days=1)
    await ingest(api, key, first, 1, created_at=moment.isoformat())
    browser = await browser_for(owner)
    page = await browser.get("/tool-calls")
    assert page.has("From (UTC)") and page.has("To (UTC)")
    assert page.has(f">{moment:%Y-%m-%d %H:%M} UTC</time>")
    assert rows((await browser.get(f"/tool-calls?start={moment:%Y-%m-%dT%H:%M}")).text) == 1
    later = moment + timedelta(minutes=1)
    assert rows((await browser.get(f"/tool-calls?start={later:%Y-%m-%dT%H:%M}")).text) == 0
    # A call's page says UTC too.
    call_id = re.findall(r'<a href="/tool-calls/([0-9a-f-]{36})">', page.text)[0]
    assert (await browser.get(f"/tool-calls/{call_id}")).has(f"{moment:%Y-%m-%d %H:%M} UTC")


async def test_the_refused_filter_and_refusals_marked(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, key, first, _ = await arrange(api, db)
    await ingest(api, key, first, 2, tool_name="search")
    await ingest(api, key, first, 1, tool_name="fetch", status="error", error_message="boom")
    # A refusal of the gateway's own: the playground's invoke of a disabled tool.
    await api.patch(f"/servers/{first}", json={"disabled_tools": ["drop_*"]}, auth=owner)
    await api.post(
        f"/servers/{first}/tools/invoke",
        json={"tool_name": "drop_table", "arguments": {}},
        auth=owner,
        expect=403,
    )
    browser = await browser_for(await api.member(owner, "member"))
    page = await browser.get("/tool-calls")
    assert rows(page.text) == 4
    assert page.text.count('class="badge call-refused">refused<') == 1
    assert page.text.count('class="badge call-error">error<') == 1
    assert '<option value="" selected>All calls</option>' in page.text

    page = await browser.get("/tool-calls?refused=true")
    assert rows(page.text) == 1 and page.has("drop_table") and page.has("1 call")
    assert '<option value="true" selected>Refused only</option>' in page.text
    refusal = re.search(r'<a href="(/tool-calls/[0-9a-f-]{36})">', page.text)
    assert refusal is not None
    details = await browser.get(refusal.group(1))
    assert 'class="badge call-refused">refused<' in details.text and details.has("refused: ")

    page = await browser.get("/tool-calls?refused=false")
    assert rows(page.text) == 3 and not page.has("drop_table") and page.has("boom")
    page = await browser.get("/tool-calls?refused=false&status=error")
    assert rows(page.text) == 1 and page.has("boom")

    page = await browser.get("/tool-calls?refused=perhaps")
    assert rows(page.text) == 0 and page.has("refused: Input should be a valid boolean")


def option(value: str, text: str, *, selected: bool = False) -> str:
    return f'<option value="{value}"{" selected" if selected else ""}>{text}</option>'


async def test_the_toolset_filter_and_the_toolset_of_each_call(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner, key, first, second = await arrange(api, db)
    browser = await browser_for(await api.member(owner, "member"))
    # No toolset in the workspace: no toolset filter.
    assert 'name="toolset_id"' not in (await browser.get("/tool-calls")).text
    research = await add_toolset(db, owner.workspace_id, "research", [first, second])
    ops = await add_toolset(db, owner.workspace_id, f"ops {HOSTILE}", [first])
    stranger = await api.signup()
    await add_toolset(db, stranger.workspace_id, "theirs")
    now = datetime.now(UTC).isoformat()
    call = {"server_id": first, "tool_name": "search", "status": "success", "created_at": now}
    await write_calls(
        api,
        owner.workspace_id,
        [
            *[{**call, "toolset_id": research} for _ in range(3)],
            {**call, "server_id": second, "toolset_id": research},
            *[{**call, "toolset_id": ops} for _ in range(2)],
        ],
    )
    await ingest(api, key, first, 1)

    page = await browser.get("/tool-calls")
    assert rows(page.text) == 7
    # The workspace's toolsets by name, and no other workspace's.
    select = re.search(
        r'<select id="f-toolset_id" name="toolset_id">(.*?)</select>', page.text, re.S
    )
    assert select is not None
    names = [unescape(n) for n in re.findall(r"<option [^>]*>([^<]*)</option>", select.group(1))]
    assert names == ["All calls", f"ops {HOSTILE}", "research"]
    assert not page.has("theirs") and HOSTILE not in page.text
    assert page.text.count("via research") == 4 and page.has(f"via ops {HOSTILE}")

    page = await browser.get(f"/tool-calls?toolset_id={research}")
    assert rows(page.text) == 4 and page.has("4 calls")
    assert option(research, "research", selected=True) in page.text
    assert (
        rows((await browser.get(f"/tool-calls?toolset_id={research}&server_id={second}")).text) == 1
    )
    page = await browser.get("/tool-calls?toolset_id=nope")
    assert rows(page.text) == 0 and page.has("toolset_id: Input should be a valid UUID")

    # One call's page names its toolset, linked to the toolset's calls; a direct call has none.
    through = await db.fetchval("SELECT id FROM tool_calls WHERE toolset_id = $1", uuid.UUID(ops))
    details = await browser.get(f"/tool-calls/{through}")
    assert f'<a href="/tool-calls?toolset_id={ops}">' in details.text
    assert details.has(f"ops {HOSTILE}") and HOSTILE not in details.text
    direct = await db.fetchval("SELECT id FROM tool_calls WHERE toolset_id IS NULL")
    assert (await browser.get(f"/tool-calls/{direct}")).has("<dt>Toolset</dt><dd>\u2013</dd>")

    # A deleted toolset's calls keep its id: listed, found and filtered by it still.
    await db.execute("DELETE FROM toolsets WHERE id = $1", uuid.UUID(ops))
    page = await browser.get("/tool-calls")
    assert page.text.count("via unknown toolset (deleted)") == 2
    page = await browser.get(f"/tool-calls?toolset_id={ops}")
    assert rows(page.text) == 2
    assert option(ops, "unknown toolset (deleted)", selected=True) in page.text
    assert (await browser.get(f"/tool-calls/{through}")).has("unknown toolset (deleted)")
