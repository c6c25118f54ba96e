"""The analytics page: the API's figures for 1, 7 or 30 days, the workspace, one server or the
calls through one toolset, and every panel of a page view counting the same calls."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

import asyncpg

from tests.helpers.analytics import iso
from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.browser import Browser, BrowserFactory
from tests.helpers.proxying import add_server
from tests.helpers.toolset_calls import add_toolset, write_calls


async def test_figures_and_charts_for_each_period_and_server(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(), "Numbers")
    key = await api.api_key(owner)
    first = await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    second = await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    calls = [
        *[{"server_id": first, "tool_name": "<b>search</b>", "status": "success",
           "duration_ms": 10 * (i + 1)} for i in range(8)],
        *[{"server_id": first, "tool_name": "fetch", "status": "error"} for _ in range(2)],
        {"server_id": second, "tool_name": "fetch", "status": "success"},
    ]  # fmt: skip
    await api.post("/tool-calls", json=calls, auth=key, expect=201)
    browser = await browser_for(await api.member(owner))
    for days in (1, 7, 30):
        page = await browser.get(f"/analytics?days={days}")
        assert page.has("11") and page.has("18.18 %"), days  # 2 of 11 failed
        # Volume and error rate; the latency of one hour is no line yet.
        assert page.text.count("<svg") == 2 and page.has("not enough data yet")
        assert page.has(f"per hour, last {24 if days == 1 else days}")
        assert "<b>search</b>" not in page.text and page.has("<b>search</b>")
    page = await browser.get(f"/analytics?days=7&server_id={second}")
    assert page.has("0.00 %") and page.has("one server") and not page.has("<b>search</b>")
    page = await browser.get("/analytics?days=2")
    assert page.has("Input should be 1, 7 or 30") and "<svg" not in page.text


async def test_figures_of_the_calls_through_one_toolset(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(), "Toolsets")
    key = await api.api_key(owner)
    first = await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    second = await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    research = await add_toolset(db, owner.workspace_id, "research", [first, second])
    await add_toolset(db, (await api.signup()).workspace_id, "theirs")
    now = iso(datetime.now(UTC))
    await write_calls(
        api,
        owner.workspace_id,
        [
            *[{"server_id": first, "tool_name": "search", "status": "success",
               "duration_ms": 20, "created_at": now, "toolset_id": research} for _ in range(3)],
            *[{"server_id": second, "tool_name": "fetch", "status": "error",
               "created_at": now, "toolset_id": research} for _ in range(2)],
        ],
    )  # fmt: skip
    direct = {"server_id": first, "tool_name": "direct", "status": "success"}
    await api.post("/tool-calls", json=[direct] * 4, auth=key, expect=201)
    browser = await browser_for(await api.member(owner))

    page = await browser.get("/analytics?days=1")
    assert agree(panels(page.text)) == 9
    assert f'<option value="{research}">research</option>' in page.text
    assert not page.has("theirs")
    page = await browser.get(f"/analytics?days=1&toolset_id={research}")
    assert agree(panels(page.text)) == 5 and panels(page.text)["failed"] == 2
    assert page.has("one toolset") and page.has("40.00 %") and not page.has("direct")
    assert f'<option value="{research}" selected>research</option>' in page.text
    # The top tools lead to their calls through the toolset.
    assert f"/tool-calls?tool_name=search&amp;toolset_id={research}" in page.text
    page = await browser.get(f"/analytics?days=1&toolset_id={research}&server_id={second}")
    assert agree(panels(page.text)) == 2 and page.has("one server") and page.has("one toolset")
    page = await browser.get("/analytics?days=1&toolset_id=nope")
    assert page.has("Input should be a valid UUID") and "<svg" not in page.text


def panels(text: str) -> dict[str, int]:
    """What each panel of an analytics page counts: the Tool calls and Failed cards, the rows
    of the top tools table (all other tools included), and the bars of the volume chart."""

    def number(pattern: str) -> list[int]:
        return [int(n.replace(",", "")) for n in re.findall(pattern, text)]

    return {
        "cards": number(r'id="total-calls">([\d,]+)<')[0],
        "failed": number(r'id="failed-calls">([\d,]+)<')[0],
        "top tools": sum(number(r'data-label="Calls" class="num">([\d,]+)<')),
        "top tools failed": sum(number(r'data-label="Errors" class="num">([\d,]+)<')),
        "volume chart": sum(number(r'<rect class="bar" [^>]*><title>[^<]*: ([\d]+) calls<')),
    }


def agree(figures: dict[str, int]) -> int:
    assert len({figures["cards"], figures["top tools"], figures["volume chart"]}) == 1, figures
    assert figures["failed"] == figures["top tools failed"], figures
    return figures["cards"]


async def signed_in(api: Api, account: Account) -> Browser:
    browser = Browser(api)
    await browser.log_in(account.email)
    await browser.post("/switch", {"workspace_id": account.workspace_id}, expect=200)
    return browser


async def test_every_panel_counts_the_same_calls(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    """Cards, top tools and the volume chart of one page view add up to the same calls: right
    after new calls land (the cached snapshot, all of it), once it is gone (all new), and with
    calls landing while the page is read."""
    api = await make_api(analytics_cache_seconds=60)
    owner = await api.org(await api.signup(), "Agreeing")
    key = await api.api_key(owner)
    servers = [await add_server(api, db, owner, "http://127.0.0.1:9/mcp") for _ in range(2)]
    now = datetime.now(UTC)
    # 14 tools (more than the table's 10), over several hours, some failing.
    batch = [
        {"server_id": servers[i % 2], "tool_name": f"tool-{i % 14:02}",
         "status": "error" if i % 5 == 0 else "success",
         "created_at": iso(now - timedelta(minutes=7 * i))}
        for i in range(60)
    ]  # fmt: skip
    await api.post("/tool-calls", json=batch, auth=key, expect=201)
    browser = await signed_in(api, owner)

    # The error rates, read (and cached) by an API client; then 13 more calls land.
    await api.get("/analytics/error-rates", params={"days": 1}, auth=key, expect=200)
    await api.post("/tool-calls", json=batch[:13], auth=key, expect=201)
    page = await browser.get("/analytics?days=1")
    assert agree(panels(page.text)) == 60  # cached: the 13 new ones in no panel yet
    assert page.has("all other tools")
    page = await browser.get(f"/analytics?days=1&server_id={servers[0]}")
    assert agree(panels(page.text)) == 30 + 7  # first asked for now: in every panel

    # A time to live of a millisecond: every view reads anew while batches land.
    api = await make_api(analytics_cache_seconds=0.001)
    owner = await api.org(await api.signup(), "Busy")
    key = await api.api_key(owner)
    server = await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    busy = [{**call, "server_id": server} for call in batch]
    await browser.close()
    browser = await signed_in(api, owner)

    async def land() -> None:
        for _ in range(15):
            await api.post("/tool-calls", json=busy, auth=key, expect=201)

    async def look() -> list[int]:
        totals = []
        for _ in range(15):
            totals.append(agree(panels((await browser.get("/analytics?days=1")).text)))
        return totals

    _, totals = await asyncio.gather(land(), look())
    assert all(total % 60 == 0 for total in totals), totals  # whole batches only
    assert agree(panels((await browser.get("/analytics?days=1")).text)) == 15 * 60
    await browser.close()
