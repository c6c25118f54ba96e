"""The dashboard in a real browser (tests/helpers/chromium.py): every page photographed at
desktop and phone width into the artifacts directory."""

from __future__ import annotations

import re
from typing import Any

import asyncpg

from tests.helpers.alerting import add_rule, add_server, deliver, evaluate, events, ingest
from tests.helpers.api import Api, AppFactory
from tests.helpers.chromium import (
    ARTIFACTS,
    WIDTHS,
    Visitor,
    needs_chromium,
    playwright_api,
    signed_in,
)
from tests.helpers.upstreams import unused_url

pytestmark = needs_chromium


async def test_a_new_user_from_sign_up_to_alert_rule(
    make_api: AppFactory,
    db: asyncpg.Connection,
    chromium: Any,
    sdk_stateless: str,
) -> None:
    # Background loops on, probing often: the new server must turn healthy by itself.
    api: Api = await make_api(run_workers=True, probe_interval_seconds=1)
    base = str(api.client.make_url("")).rstrip("/")
    context = await chromium.new_context(viewport={"width": 1280, "height": 900})
    visitor = Visitor(await context.new_page(), base)
    page = visitor.page
    expect = playwright_api.expect

    await visitor.open("/")
    await expect(page).to_have_url(re.compile(r"/login$"))
    await visitor.photograph("login")
    await page.get_by_role("link", name="Sign up").click()
    await visitor.photograph("signup")
    await page.get_by_label("Name").fill("Ada Lovelace")
    await page.get_by_label("Email").fill("ada@example.com")
    await page.get_by_label("Password").fill("correct horse battery")
    await page.get_by_role("button", name="Sign up").click()
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    await visitor.photograph("overview-empty")

    # Register the real SDK server.
    await page.get_by_role("link", name="Register a server").first.click()
    await page.get_by_role("textbox", name="Name", exact=True).fill("sdk-demo")
    await page.get_by_label("MCP endpoint URL").fill(sdk_stateless)
    await page.get_by_label("Description").fill("the official MCP SDK server")
    await page.get_by_label("Tags").fill("demo, sdk")
    await visitor.photograph("server-form")
    await page.get_by_role("button", name="Register server").click()
    await expect(page.get_by_role("heading", name=re.compile("sdk-demo"))).to_be_visible()
    # It turns healthy once the background prober has been: reload until it has.
    for _ in range(30):
        if await page.locator(".badge.status-healthy").count():
            break
        await page.wait_for_timeout(500)
        await page.reload()
    await expect(page.locator("h1 .badge.status-healthy")).to_be_visible()
    # Times are shown in UTC and say so, the zone the tool-call filters take.
    checked = page.locator("table time").first
    await expect(checked).to_contain_text("UTC")
    await visitor.photograph("server")

    # Invoke a tool from the playground.
    await page.get_by_role("link", name="Open the playground").click()
    arguments = page.get_by_label("Arguments for echo (JSON object)")
    await arguments.fill('{"text": "hello from the browser"}')
    await page.get_by_role("button", name="Call echo").click()
    await expect(page.locator(".result")).to_contain_text("hello from the browser")
    await expect(page.locator(".result .badge.call-success")).to_be_visible()
    await visitor.photograph("playground")
    # A schema violation is shown next to the field, and nothing is called.
    await page.get_by_label("Arguments for add (JSON object)").fill('{"a": "one"}')
    await page.get_by_role("button", name="Call add").click()
    await expect(page.locator("#args-error-1")).to_contain_text('"one" is not of type "integer"')

    # The call is in the log, and in the charts.
    await page.get_by_role("link", name="Tool calls").first.click()
    await expect(page.locator("table")).to_contain_text("echo")
    await expect(page.locator("table")).to_contain_text("mcp-gateway-playground")
    await visitor.photograph("tool-calls")
    await page.locator("table a").first.click()
    await expect(page.get_by_role("heading", name=re.compile("echo"))).to_be_visible()
    await visitor.photograph("tool-call")
    await page.get_by_role("link", name="Analytics").click()
    await page.get_by_label("Period").select_option("1")
    await page.get_by_role("button", name="Show analytics").click()
    await expect(page.locator(".chart .bar").first).to_be_attached()
    await expect(page.get_by_role("table")).to_contain_text("echo")
    await visitor.photograph("analytics")

    # An alert rule.
    await page.get_by_role("link", name="Alerts").click()
    await page.get_by_role("link", name="New rule").click()
    await page.get_by_role("textbox", name="Name", exact=True).fill("Too many errors")
    await page.get_by_label("Metric").select_option("error_rate")
    await page.get_by_label("Operator").select_option(">")
    await page.get_by_label("Threshold").fill("0.2")
    await page.get_by_label("Window").fill("15")
    await visitor.photograph("alert-rule-form")
    await page.get_by_role("button", name=re.compile("Create rule|Save")).click()
    await expect(page.get_by_role("table").first).to_contain_text("Too many errors")
    await visitor.photograph("alerts")
    assert await db.fetchval("SELECT name FROM alert_rules") == "Too many errors"

    # Invite a member.
    await page.get_by_role("link", name="Settings").click()
    await page.get_by_role("textbox", name="Email", exact=True).fill("grace@example.com")
    await page.get_by_role("button", name=re.compile("Invite|Send invitation")).click()
    await expect(page.get_by_text("grace@example.com").first).to_be_visible()
    await visitor.photograph("settings")
    assert await db.fetchval("SELECT email FROM invites") == "grace@example.com"

    await visitor.open("/")
    await expect(page.locator(".verdict.good")).to_be_visible()
    await visitor.photograph("overview")
    assert visitor.problems == [], visitor.problems
    await visitor.page.context.close()


async def test_the_api_docs_render_under_their_security_policy(api: Api, chromium: Any) -> None:
    """Swagger UI, on the dashboard's origin, works with scripts from here only and shows
    every operation of the document, on a desktop and on a phone."""
    base = str(api.client.make_url("")).rstrip("/")
    document = (await api.get("/openapi.json", expect=200)).body
    operations = sum(
        method in {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
        for item in document["paths"].values()
        for method in item
    )
    expect = playwright_api.expect
    for device, width in WIDTHS.items():
        context = await chromium.new_context(viewport={"width": width, "height": 900})
        visitor = Visitor(await context.new_page(), base)
        page = visitor.page
        await visitor.open("/api/v1/docs")
        await expect(page.get_by_text("/api/v1/proxy/{server_id}/mcp").first).to_be_visible()
        await expect(page.locator(".opblock")).to_have_count(operations)
        servers = page.locator(
            '.opblock-get:has(.opblock-summary-path[data-path="/api/v1/servers"])'
        )
        await expect(servers).to_have_count(1)
        await expect(servers).to_be_visible()
        await expect(page.get_by_text("Unable to render this definition")).to_have_count(0)
        await expect(page.locator(".errors-wrapper")).to_have_count(0)
        box = await servers.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, box
        await page.screenshot(path=ARTIFACTS / f"api-docs-{device}.png", full_page=True)
        await servers.click()  # opened: its parameters and responses, within the screen too
        await expect(servers.locator(".opblock-body")).to_be_visible()
        await servers.scroll_into_view_if_needed()
        await page.screenshot(path=ARTIFACTS / f"api-docs-servers-{device}.png")
        overflow = await page.evaluate("document.documentElement.scrollWidth - innerWidth")
        assert overflow <= 1, f"the docs are {overflow}px wider than the {device}"
        assert visitor.problems == [], (device, visitor.problems)
        await context.close()


# What must stay within a phone's width on each page: status badges, and buttons by name.
_OUTSIDE = """(width) => {
  const outside = [];
  for (const node of document.querySelectorAll(
      ".table-wrap td, .table-wrap .badge, .table-wrap button, .table-wrap .button")) {
    const box = node.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;  // not shown
    if (box.left < -0.5 || box.right > width + 0.5) {
      outside.push(`${node.tagName} "${node.textContent.trim().slice(0, 40)}" `
                   + `${Math.round(box.left)}..${Math.round(box.right)}`);
    }
  }
  return outside;
}"""


async def _on_a_phone(visitor: Visitor, name: str, *, shown: list[Any]) -> None:
    """At 390 px: every cell, badge and button of the page's tables within the screen (the
    ones in `shown` present), and every link of the nav in sight. Photographed at both widths."""
    page = visitor.page
    await visitor.photograph(name)
    width = WIDTHS["phone"]
    await page.set_viewport_size({"width": width, "height": 900})
    try:
        assert await page.evaluate(_OUTSIDE, width) == [], name
        for locator in shown:
            await playwright_api.expect(locator.first).to_be_visible()
            for index in range(await locator.count()):
                if not await locator.nth(index).is_visible():
                    continue  # an empty cell, left out of its card
                box = await locator.nth(index).bounding_box()
                assert box is not None, (name, locator)
                assert box["x"] >= 0 and box["x"] + box["width"] <= width, (name, locator, box)
        # The nav wraps rather than hiding sections past the edge.
        links = page.locator(".nav a")
        assert await links.count() == 7
        for index in range(7):
            box = await links.nth(index).bounding_box()
            assert box is not None and box["x"] + box["width"] <= width, (name, index, box)
        assert await page.evaluate(
            "(() => { const n = document.querySelector('.nav'); "
            "return n.scrollWidth <= n.clientWidth; })()"
        ), name
    finally:
        await page.set_viewport_size({"width": WIDTHS["desktop"], "height": 900})


async def test_every_table_keeps_its_status_and_buttons_on_a_phone(
    api: Api, chromium: Any, sdk_stateless: str
) -> None:
    owner = await api.signup(name="Ada Lovelace")
    key = await api.api_key(owner, "ci-agent-with-a-rather-long-name")
    await api.member(owner)
    await api.invite(owner, "grace.hopper.with.a.long.address@example.com")
    elsewhere = await api.signup(name="Someone Else")
    await api.invite(elsewhere, owner.email)  # a pending invitation on the account page
    healthy = await add_server(api, owner, "sdk-demo", sdk_stateless)
    down = await add_server(api, owner, "a-server-with-a-long-name-that-is-down")
    for server in (healthy, down):
        await api.post(f"/servers/{server}/probe", auth=owner, expect=200)
    toolset = await api.post(
        "/toolsets",
        json={
            "name": "a-toolset-with-a-rather-long-name-for-a-phone",
            "servers": [{"server_id": healthy}, {"server_id": down, "tools": ["search_*"]}],
        },
        auth=owner,
        expect=201,
    )
    toolset_id = toolset.body["id"]
    calls = [{"tool_name": "search_the_whole_knowledge_base", "duration_ms": 40 + i}
             for i in range(6)]  # fmt: skip
    failed = {"tool_name": "fetch", "status": "error", "error_message": "upstream said " * 12}
    await ingest(api, key, healthy, [*calls, failed, failed])
    await add_rule(
        api, owner, name="Too many errors", metric="error_rate", threshold=0.1,
        server_id=healthy, webhook_url=unused_url(),
    )  # fmt: skip
    await evaluate(api)
    await deliver(api)
    [event] = await events(api, owner)

    base = str(api.client.make_url("")).rstrip("/")
    visitor = await signed_in(chromium, base, owner, WIDTHS["desktop"])
    page = visitor.page

    badge = page.locator(".table-wrap .badge")
    button = page.get_by_role("button")
    pages = {
        "/": ("overview-tables", [badge]),
        "/servers": ("servers-tables", [badge]),
        f"/servers/{healthy}": ("server-tables", [page.locator(".table-wrap .badge")]),
        f"/servers/{healthy}/tools": ("playground-tables", [page.locator(".table-wrap td")]),
        "/toolsets": ("toolsets-tables", [page.locator(".table-wrap td a")]),
        f"/toolsets/{toolset_id}": ("toolset-tables", [badge, page.locator(".table-wrap td")]),
        # Forms without tables: within the phone's width all the same.
        "/toolsets/new": ("toolset-new", []),
        f"/toolsets/{toolset_id}/edit": ("toolset-edit", []),
        "/tool-calls": ("tool-calls-tables", [page.locator(".table-wrap .call-error")]),
        "/analytics?days=1": ("analytics-tables", [page.locator(".table-wrap td.num")]),
        "/alerts": (
            "alerts-tables",
            [page.locator(".table-wrap .event-FIRING"), button.filter(has_text="Delete rule")],
        ),
        f"/alerts/events/{event['id']}": ("alert-event-tables", [page.locator(".table-wrap td")]),
        "/settings": (
            "settings-tables",
            [button.filter(has_text="Remove"), button.filter(has_text="Revoke")],
        ),
        "/account": ("account-tables", [page.locator(".table-wrap td")]),
    }
    for path, (name, shown) in pages.items():
        await visitor.open(path)
        await _on_a_phone(visitor, name, shown=shown)
    # Each of these rows holds its buttons: a member, an invitation, an API key.
    await visitor.open("/settings")
    assert await button.filter(has_text="Revoke").count() == 2
    assert visitor.problems == [], visitor.problems
    await visitor.page.context.close()
