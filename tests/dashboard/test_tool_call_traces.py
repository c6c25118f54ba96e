"""A call's trace in the tool-call log and on the call's page: a link from GATEWAY_TRACE_URL
opening in a new tab, else the id to copy; nothing for a call without a trace id."""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.browser import Browser, Page

TEMPO = "https://tempo.example/trace/{trace_id}"

Arranged = tuple[Browser, str, str]


@pytest.fixture
async def arrange(make_api: AppFactory) -> AsyncIterator[Callable[..., Awaitable[Arranged]]]:
    """arrange(**settings): an app, a signed-in browser, and two calls of a server: a failed
    one with a trace id (returned) and one without."""
    browsers: list[Browser] = []

    async def make(**settings: Any) -> Arranged:
        api = await make_api(**settings)
        owner = await api.signup()
        trace_id = secrets.token_hex(16)
        await ingest(api, owner, trace_id)
        browser = Browser(api)
        browsers.append(browser)
        await browser.log_in(owner.email)
        await browser.post("/switch", {"workspace_id": owner.workspace_id}, expect=200)
        return browser, trace_id, owner.workspace_id

    yield make
    for browser in browsers:
        await browser.close()


async def ingest(api: Api, owner: Account, trace_id: str) -> None:
    server = await api.post(
        "/servers", json={"name": "billing", "url": "http://127.0.0.1:9/mcp"}, auth=owner
    )
    calls = [
        {
            "server_id": server.body["id"],
            "tool_name": "charge",
            "status": "error",
            "error_message": "card declined",
            "trace_id": trace_id,
        },
        {"server_id": server.body["id"], "tool_name": "refund", "status": "success"},
    ]
    await api.post("/tool-calls", json=calls, auth=owner, expect=201)


def call_pages(page: Page) -> dict[str, str]:
    """Each call's row of the log, by its tool name (HTML), and the link to the call's page."""
    found = {}
    for row in re.findall(r"<tr>(.*?)</tr>", page.text, re.S):
        link = re.search(r'href="(/tool-calls/[0-9a-f-]{36})"', row)
        tool = re.search(r'data-label="Tool" class="mono">([^<]+)<', row)
        if link and tool:
            found[tool.group(1)] = row
            found[f"{tool.group(1)} page"] = link.group(1)
    return found


async def test_with_a_trace_url_a_call_links_to_its_trace_in_a_new_tab(
    arrange: Callable[..., Awaitable[Arranged]],
) -> None:
    browser, trace_id, _ = await arrange(trace_url=TEMPO)
    href = f"https://tempo.example/trace/{trace_id}"
    link = (
        f'<a class="trace-link{{}}" href="{href}" target="_blank" rel="noopener noreferrer" '
        f'title="Trace {trace_id}, in a new tab">'
    )
    rows = call_pages(await browser.get("/tool-calls"))
    assert link.format(" trace") + "trace<" in rows["charge"]
    assert "trace" not in rows["refund"]

    page = await browser.get(rows["charge page"])
    assert link.format(" mono") + trace_id + "<" in page.text
    assert "<dt>Trace</dt>" in page.text
    untraced = await browser.get(rows["refund page"])
    assert "<dt>Trace</dt>" not in untraced.text and "trace-link" not in untraced.text


async def test_without_a_trace_url_the_id_is_shown_whole_to_copy(
    arrange: Callable[..., Awaitable[Arranged]],
) -> None:
    browser, trace_id, _ = await arrange()
    rows = call_pages(await browser.get("/tool-calls"))
    short = (
        f'<span class="trace muted">trace <span class="mono trace-id short" title="{trace_id}">'
        f"{trace_id}</span></span>"
    )
    assert short in rows["charge"]
    assert "trace" not in rows["refund"]
    assert "tempo" not in rows["charge"] and '<a class="trace-link' not in rows["charge"]

    page = await browser.get(rows["charge page"])
    assert f'<dd><span class="mono trace-id" title="{trace_id}">{trace_id}</span></dd>' in (
        page.text
    )
    assert "trace-link" not in page.text
    untraced = await browser.get(rows["refund page"])
    assert "<dt>Trace</dt>" not in untraced.text and "trace-id" not in untraced.text


async def test_the_link_is_escaped_in_its_attribute(
    arrange: Callable[..., Awaitable[Arranged]],
) -> None:
    """A template's query string (& between parameters) reaches the page escaped."""
    template = 'https://grafana.example/explore?orgId=1&q="{trace_id}"&x=<b>'
    browser, trace_id, _ = await arrange(trace_url=template)
    rows = call_pages(await browser.get("/tool-calls"))
    escaped = f"https://grafana.example/explore?orgId=1&amp;q=&#34;{trace_id}&#34;&amp;x=&lt;b&gt;"
    assert f'href="{escaped}"' in rows["charge"]
    page = await browser.get(rows["charge page"])
    assert f'href="{escaped}"' in page.text
    assert "<b>" not in page.text
