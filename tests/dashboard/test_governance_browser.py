"""Governed access in a real browser (headless Chromium, as tests/dashboard/test_browser.py):
an API key's scope and a server's disabled tools edited through their forms, at desktop and
phone width, every control and cell within a phone's screen; photographed into the artifacts
directory."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.helpers.alerting import add_server
from tests.helpers.api import Api
from tests.helpers.chromium import WIDTHS, fits_a_phone, needs_chromium, playwright_api, signed_in

pytestmark = needs_chromium


@pytest.mark.parametrize("device", list(WIDTHS))
async def test_a_keys_scope_and_a_servers_disabled_tools_through_their_forms(
    api: Api,
    chromium: Any,
    sdk_stateless: str,
    device: str,
) -> None:
    width = WIDTHS[device]
    owner = await api.signup(name="Ada Lovelace")
    sdk = await add_server(api, owner, "sdk-demo", sdk_stateless)
    await add_server(api, owner, "an-archive-server-with-a-rather-long-name-indeed")
    await api.api_key(owner, "ci-agent-with-a-rather-long-name")
    visitor = await signed_in(chromium, str(api.client.make_url("")).rstrip("/"), owner, width)
    page = visitor.page
    expect = playwright_api.expect

    # -- an API key's scope ------------------------------------------------------------
    await page.get_by_role("link", name="Settings").click()
    await expect(page.locator("td.scope-summary")).to_have_text("everything")
    await page.get_by_role("link", name="Edit scope of ci-agent-with-a-rather-long-name").click()
    await page.get_by_role("checkbox", name=re.compile("ingest:")).uncheck()
    # Checking a server chooses "only these" (the page's script).
    await page.get_by_label("sdk-demo").check()
    await expect(page.get_by_label("Only the servers checked below")).to_be_checked()
    await page.get_by_label("Tools it may call").fill("echo\nadd")
    await page.get_by_label("Rate limit").fill("lots")
    await page.get_by_role("button", name=re.compile("^Save scope of")).click()
    # Refused: said by the field, what was typed kept.
    await expect(page.locator("#key-rate_limit-error")).to_contain_text("e.g. '100/minute'")
    await expect(page.get_by_label("Tools it may call")).to_have_value("echo\nadd")
    await fits_a_phone(visitor, "key-scope-error", width)
    await page.get_by_label("Rate limit").fill("100/minute")
    await fits_a_phone(visitor, "key-scope-form", width)
    await page.get_by_role("button", name=re.compile("^Save scope of")).click()
    summary = page.locator("td.scope-summary")
    await expect(summary).to_have_text("proxy, read · 1 server · echo, add · 100/minute")
    await page.locator("#api-keys").scroll_into_view_if_needed()
    await fits_a_phone(visitor, "settings-key-scopes", width)
    [key] = (await api.get(f"/workspaces/{owner.workspace_id}/api-keys", auth=owner)).body
    assert (key["permissions"], key["allowed_servers"]) == (["proxy", "read"], [sdk])
    assert (key["allowed_tools"], key["rate_limit"]) == (["echo", "add"], "100/minute")

    # "All servers" unchecks them again.
    await page.get_by_role("link", name=re.compile("^Edit scope of")).click()
    await expect(page.get_by_label("sdk-demo")).to_be_checked()
    await page.get_by_label("All servers of the workspace, also those registered later").check()
    await expect(page.get_by_label("sdk-demo")).not_to_be_checked()
    await page.get_by_role("link", name="Cancel").click()

    # -- a server's disabled tools -------------------------------------------------------
    await visitor.open(f"/servers/{sdk}")
    await page.get_by_role("link", name="Tool rules").click()
    await page.get_by_label("fail", exact=True).check()
    await page.get_by_label("More tools to disable, or patterns").fill("sl*")
    await page.get_by_label("Rate limit").fill("600/minute")
    await fits_a_phone(visitor, "server-rules-form", width)
    await page.get_by_role("button", name="Save tool rules").click()
    await expect(page.locator("dl.facts")).to_contain_text("600/minute")
    await expect(page.locator("dl.facts .tool-disabled")).to_have_text(["fail", "sl*"])
    await fits_a_phone(visitor, "server-rules", width)
    server = (await api.get(f"/servers/{sdk}", auth=owner)).body
    assert (server["disabled_tools"], server["rate_limit"]) == (["fail", "sl*"], "600/minute")

    # The playground marks them; calling one says why it is refused.
    await page.get_by_role("link", name="Open the playground").click()
    fail = page.locator("section.tool", has=page.get_by_role("heading", name=re.compile("^fail")))
    await expect(fail.locator(".badge.tool-disabled")).to_have_text("disabled")
    await fail.get_by_role("button", name="Call fail").click()
    refusal = page.locator("section.tool .alert.error")
    await expect(refusal).to_contain_text("tool 'fail' is disabled on this server")
    await refusal.scroll_into_view_if_needed()
    await fits_a_phone(visitor, "playground-disabled", width)

    # The refusal is in the log, found by the filter and marked.
    await page.get_by_role("link", name="Tool calls").first.click()
    await page.get_by_label("Refused").select_option("true")
    await page.get_by_role("button", name="Filter calls").click()
    await expect(page.locator("table .badge.call-refused")).to_have_count(1)
    await expect(page.locator("table")).to_contain_text("fail")
    await fits_a_phone(visitor, "tool-calls-refused", width)

    assert visitor.problems == [], visitor.problems
    await visitor.page.context.close()
