"""The toolset filter of the tool calls and analytics pages in a real browser (headless Chromium,
as tests/dashboard/test_browser.py): chosen through the forms, at desktop and phone width,
every control and cell within a phone's screen; photographed into the artifacts directory."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from tests.helpers.alerting import add_server
from tests.helpers.api import Api
from tests.helpers.chromium import (
    WIDTHS,
    fits_a_phone,
    needs_chromium,
    playwright_api,
    signed_in,
)
from tests.helpers.toolset_calls import add_toolset, write_calls

pytestmark = needs_chromium

LONG = "a-toolset-for-research-with-a-rather-long-name-indeed"


@pytest.mark.parametrize("device", list(WIDTHS))
async def test_the_toolset_filters_through_their_forms(
    api: Api, db: asyncpg.Connection, chromium: Any, device: str
) -> None:
    width = WIDTHS[device]
    owner = await api.signup(name="Ada Lovelace")
    key = await api.api_key(owner)
    server = await add_server(api, owner, "an-archive-server-with-a-rather-long-name-indeed")
    toolset = await add_toolset(db, owner.workspace_id, LONG, [server])
    await add_toolset(db, owner.workspace_id, "ops", [server])
    now = datetime.now(UTC).isoformat()
    call = {"server_id": server, "status": "success", "duration_ms": 25, "created_at": now}
    await write_calls(
        api,
        owner.workspace_id,
        [{**call, "tool_name": "search_the_whole_knowledge_base", "toolset_id": toolset}] * 3,
    )
    direct = {"server_id": server, "tool_name": "fetch", "status": "success"}
    await api.post("/tool-calls", json=[direct] * 2, auth=key, expect=201)
    visitor = await signed_in(chromium, str(api.client.make_url("")).rstrip("/"), owner, width)
    page = visitor.page
    expect = playwright_api.expect

    await page.get_by_role("link", name="Tool calls").first.click()
    await expect(page.locator("table tbody tr")).to_have_count(5)
    await page.get_by_label("Toolset").select_option(label=LONG)
    await page.get_by_role("button", name="Filter calls").click()
    await expect(page).to_have_url(re.compile(f"toolset_id={toolset}"))
    rows = page.locator("table tbody tr")
    await expect(rows).to_have_count(3)
    await expect(rows.first).to_contain_text(f"via {LONG}")
    await fits_a_phone(visitor, "tool-calls-toolset", width)

    # A call's page names the toolset, which leads back to its calls.
    await rows.first.get_by_role("link").first.click()
    await expect(page.locator("dl.facts")).to_contain_text(LONG)
    await fits_a_phone(visitor, "tool-call-toolset", width)
    await page.locator("dl.facts").get_by_role("link", name=LONG).click()
    await expect(page.locator("table tbody tr")).to_have_count(3)

    await page.get_by_role("link", name="Analytics").first.click()
    await expect(page.locator("#total-calls")).to_have_text("5")
    await page.get_by_label("Period").select_option(label="24 hours")
    await page.get_by_label("Toolset").select_option(label=LONG)
    await page.get_by_role("button", name="Show analytics").click()
    await expect(page.locator("#total-calls")).to_have_text("3")
    await expect(page.get_by_label("Toolset")).to_have_value(toolset)
    await fits_a_phone(visitor, "analytics-toolset", width)
    assert visitor.problems == [], visitor.problems
    await page.context.close()
