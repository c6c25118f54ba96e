"""A call's trace in a real browser (headless Chromium, as tests/dashboard/test_browser.py):
the link opens the trace in a new tab, the id without one is selected whole with a click, at
desktop and phone width, within a phone's screen; photographed into the artifacts directory."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from tests.helpers.api import AppFactory
from tests.helpers.chromium import WIDTHS, fits_a_phone, needs_chromium, playwright_api, signed_in

pytestmark = needs_chromium

TEMPO = "https://tempo.example/trace/{trace_id}"
LONG_ERROR = (
    "upstream answered HTTP 503: the billing backend is being redeployed, "
    "retry in a few minutes (request 7f3a)"
)


async def arranged(make_api: AppFactory, chromium: Any, width: int, **settings: Any) -> Any:
    """A signed-in visitor of an app whose log holds a failed, traced call and a plain one."""
    api = await make_api(**settings)
    owner = await api.signup(name="Ada Lovelace")
    server = await api.post(
        "/servers",
        json={"name": "a-billing-server-with-a-rather-long-name", "url": "http://127.0.0.1:9/mcp"},
        auth=owner,
        expect=201,
    )
    trace_id = secrets.token_hex(16)
    failed = {
        "tool_name": "charge_the_customers_card_now",
        "status": "error",
        "error_message": LONG_ERROR,
        "trace_id": trace_id,
        "caller_agent": "claude-code",
        "duration_ms": 1234,
    }
    plain = {"tool_name": "refund", "status": "success", "duration_ms": 12}
    calls = [{"server_id": server.body["id"], **call} for call in (plain, failed)]
    await api.post("/tool-calls", json=calls, auth=owner, expect=201)
    base = str(api.client.make_url("")).rstrip("/")
    return await signed_in(chromium, base, owner, width), trace_id


@pytest.mark.parametrize("device", list(WIDTHS))
async def test_a_failed_call_links_to_its_trace(
    make_api: AppFactory, chromium: Any, device: str
) -> None:
    width = WIDTHS[device]
    visitor, trace_id = await arranged(make_api, chromium, width, trace_url=TEMPO)
    page = visitor.page
    expect = playwright_api.expect

    await page.get_by_role("link", name="Tool calls").first.click()
    rows = page.locator("table tbody tr")
    await expect(rows).to_have_count(2)
    failed = rows.filter(has_text="charge_the_customers_card_now")
    link = failed.get_by_role("link", name="trace")
    await expect(link).to_have_attribute("href", f"https://tempo.example/trace/{trace_id}")
    await expect(link).to_have_attribute("target", "_blank")
    await expect(link).to_have_attribute("rel", "noopener noreferrer")
    await expect(rows.filter(has_text="refund").get_by_role("link", name="trace")).to_have_count(0)
    await fits_a_phone(visitor, "tool-calls-trace-link", width)

    await failed.get_by_role("link").first.click()
    facts = page.locator("dl.facts")
    link = facts.get_by_role("link", name=trace_id)
    await expect(link).to_have_attribute("href", f"https://tempo.example/trace/{trace_id}")
    await expect(link).to_have_attribute("target", "_blank")
    await fits_a_phone(visitor, "tool-call-trace-link", width)
    assert visitor.problems == [], visitor.problems
    await page.context.close()


@pytest.mark.parametrize("device", list(WIDTHS))
async def test_without_a_trace_url_a_click_selects_the_whole_id(
    make_api: AppFactory, chromium: Any, device: str
) -> None:
    width = WIDTHS[device]
    visitor, trace_id = await arranged(make_api, chromium, width)
    page = visitor.page
    expect = playwright_api.expect

    await page.get_by_role("link", name="Tool calls").first.click()
    shown = page.locator("table tbody tr .trace-id")
    await expect(shown).to_have_count(1)
    await expect(shown).to_have_attribute("title", trace_id)
    # Cut short on screen, whole when selected.
    box = await shown.bounding_box()
    assert box is not None and box["width"] < 100, box
    await shown.click()
    assert await page.evaluate("getSelection().toString()") == trace_id
    await fits_a_phone(visitor, "tool-calls-trace-id", width)

    traced = page.locator("table tbody tr").filter(has=page.locator(".trace-id"))
    await traced.get_by_role("link").first.click()
    whole = page.locator("dl.facts .trace-id")
    await expect(whole).to_have_text(trace_id)
    await whole.click()
    assert await page.evaluate("getSelection().toString()") == trace_id
    await fits_a_phone(visitor, "tool-call-trace-id", width)
    assert visitor.problems == [], visitor.problems
    await page.context.close()
