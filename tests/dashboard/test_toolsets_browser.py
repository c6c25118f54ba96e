"""Toolsets in a real browser (headless Chromium, as tests/dashboard/test_browser.py): a toolset
made and edited through its form over two real SDK servers, its page's exposed tools and the
"Connect an agent" panel's copy buttons, at desktop and phone width, nothing cut off at 390 px;
photographed into the artifacts directory."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gateway.dashboard.connect import KEY_PLACEHOLDER, snippets
from tests.helpers.alerting import add_server
from tests.helpers.api import Api
from tests.helpers.chromium import WIDTHS, fits_a_phone, needs_chromium, playwright_api, signed_in

pytestmark = needs_chromium


@pytest.mark.parametrize("device", list(WIDTHS))
async def test_a_toolset_through_its_form_and_its_page(
    api: Api, chromium: Any, sdk_stateless: str, sdk_stateful: str, device: str
) -> None:
    width = WIDTHS[device]
    owner = await api.signup(name="Ada Lovelace")
    demo = await add_server(api, owner, "sdk-demo", sdk_stateless)
    search = await add_server(api, owner, "search-with-a-rather-long-server-name", sdk_stateful)
    await add_server(api, owner, "not-in-the-toolset")
    visitor = await signed_in(
        chromium,
        str(api.client.make_url("")).rstrip("/"),
        owner,
        width,
        permissions=["clipboard-read", "clipboard-write"],
    )
    page = visitor.page
    expect = playwright_api.expect

    # -- made through the form --------------------------------------------------------------
    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Toolsets").click()
    await expect(page.get_by_role("heading", name="Toolsets")).to_be_visible()
    await page.get_by_role("link", name="New toolset").first.click()
    await page.get_by_role("textbox", name="Name", exact=True).fill("Research agent")
    await page.get_by_role("checkbox", name="sdk-demo").check()
    await page.get_by_role("checkbox", name="search-with-a-rather-long-server-name").check()
    await page.get_by_label("Order of search-with-a-rather-long-server-name").fill("1")
    await page.get_by_label("Order of sdk-demo").fill("2")
    await page.get_by_label("Prefix of search-with-a-rather-long-server-name").fill("")
    demo_block = page.locator(".member", has=page.get_by_role("checkbox", name="sdk-demo"))
    await demo_block.locator("summary").click()
    await page.get_by_label("Tool patterns of sdk-demo").fill("add\nech?")
    await page.get_by_label("Prefix of sdk-demo").fill("demo.")  # refused: said by its server
    await page.get_by_role("button", name="Create toolset").click()
    await expect(demo_block.locator(".error")).to_have_text(
        "may hold only letters, digits, _ and - (names clients accept)"
    )
    await expect(page.get_by_label("Tool patterns of sdk-demo")).to_have_value("add\nech?")
    await fits_a_phone(visitor, "toolset-form-error", width)
    await page.get_by_label("Prefix of sdk-demo").fill("sdk_demo__")
    await page.get_by_role("button", name="Create toolset").click()

    # -- its page: the tools it exposes, and how to connect ----------------------------------
    await expect(page.get_by_role("heading", name="Research agent")).to_be_visible()
    exposed = page.locator("section", has=page.get_by_role("heading", name="Tools it exposes"))
    await expect(exposed.locator("td.mono").first).to_have_text("add")  # search's, no prefix
    await expect(exposed).to_contain_text("sdk_demo__echo")
    await expect(exposed.get_by_role("heading", name=re.compile("^Left out"))).to_have_count(0)
    await fits_a_phone(visitor, "toolset-page", width)
    [toolset] = (await api.get("/toolsets", auth=owner, expect=200)).body
    assert toolset["servers"] == [
        {"server_id": search, "tools": None, "prefix": ""},
        {"server_id": demo, "tools": ["add", "ech?"], "prefix": None},
    ]
    panel = page.locator("#connect")
    expected = {
        "connect-url": toolset["url"],
        "connect-header": f"Authorization: Bearer {KEY_PLACEHOLDER}",
        **{s.id: s.text for s in snippets(toolset["name"], toolset["url"])},
    }
    buttons = panel.locator("button[data-copy]")
    assert await buttons.count() == len(expected)
    for index in range(len(expected)):
        button = buttons.nth(index)
        target = await button.get_attribute("data-copy")
        assert target is not None
        await button.click()
        await expect(button).to_have_text("Copied")
        copied = await page.evaluate("navigator.clipboard.readText()")
        assert copied == expected[target], target

    # -- edited with the tool picker -----------------------------------------------------------
    await page.get_by_role("link", name="Edit").click()
    demo_block = page.locator(".member", has=page.get_by_role("checkbox", name="sdk-demo"))
    await expect(demo_block.get_by_label("add", exact=True)).to_be_checked()
    await demo_block.get_by_label("fail", exact=True).check()
    await demo_block.get_by_label("Tool patterns of sdk-demo").fill("")
    await fits_a_phone(visitor, "toolset-edit", width)
    await page.get_by_role("button", name="Save changes").click()
    await expect(exposed).to_contain_text("sdk_demo__fail")
    [toolset] = (await api.get("/toolsets", auth=owner, expect=200)).body
    assert toolset["servers"][1]["tools"] == ["add", "fail"]

    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Toolsets").click()
    await expect(page.locator("table")).to_contain_text("Research agent")
    await fits_a_phone(visitor, "toolsets", width)
    assert visitor.problems == [], visitor.problems
    await visitor.page.context.close()
