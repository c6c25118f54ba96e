"""The analytics page: the API's figures for 1, 7 or 30 days, the workspace or one server."""

from __future__ import annotations

import asyncpg

from tests.helpers.api import Api
from tests.helpers.browser import BrowserFactory
from tests.helpers.proxying import add_server


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
        assert page.text.count("<svg") == 3  # volume, error rate, latency
        assert page.has(f"per hour, last {24 if days == 1 else days}")
        assert "<b>search</b>" not in page.text and page.has("<b>search</b>")
    page = await browser.get(f"/analytics?days=7&server_id={second}")
    assert page.has("0.00 %") and page.has("one server") and not page.has("<b>search</b>")
    page = await browser.get("/analytics?days=2")
    assert page.has("Input should be 1, 7 or 30") and "<svg" not in page.text
