"""The dashboard in a real browser: headless Chromium (Debian's `chromium`) driven by Playwright.

Playwright cannot download its own browser here, so it drives the system's: without one these
tests skip, saying how to get it (`apt-get install chromium`; `.ci/run` does). Every page is
also photographed at desktop and phone width into the artifacts directory
(TEST_ARTIFACTS_DIR, default test-artifacts/ beside this repository's README).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.helpers.api import Api, AppFactory

playwright_api = pytest.importorskip(
    "playwright.async_api", reason="pip install playwright (in the test extras)"
)

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium: install Debian's package (apt-get install chromium; .ci/run does) "
    "or set CHROMIUM_PATH",
)

ARTIFACTS = Path(
    os.environ.get("TEST_ARTIFACTS_DIR") or Path(__file__).parents[2] / "test-artifacts"
)
WIDTHS = {"desktop": 1280, "phone": 390}
# What Chromium must not do on this closed network (see the machine notes).
_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
async def chromium() -> AsyncIterator[Any]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, before any page)
    async with playwright_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=_FLAGS)
        yield browser
        await browser.close()


class Visitor:
    """A person at the browser, with a page open; photographs what they see."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.problems: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.problems.append(f"script error: {exc}"))
        page.on("response", self._response)

    def _console(self, message: Any) -> None:
        # A CSP violation or a script error shows here first. (Answers with a 4xx status are
        # logged too: the test makes some on purpose and checks them itself.)
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.problems.append(message.text)

    def _response(self, response: Any) -> None:
        if response.status >= 500:  # a 500 is a bug, whatever page shows it
            self.problems.append(f"{response.status} from {response.url}")

    async def open(self, path: str) -> None:
        response = await self.page.goto(self.base + path)
        assert response is not None and response.ok, f"{path}: {response and response.status}"

    async def photograph(self, name: str) -> None:
        for device, width in WIDTHS.items():
            await self.page.set_viewport_size({"width": width, "height": 900})
            await self.page.screenshot(path=ARTIFACTS / f"{name}-{device}.png", full_page=True)
            if device == "phone":
                # Nothing wider than the phone: no sideways scrolling of the whole page.
                overflow = await self.page.evaluate(
                    "document.documentElement.scrollWidth - window.innerWidth"
                )
                assert overflow <= 1, f"{name} is {overflow}px wider than a phone"
        await self.page.set_viewport_size({"width": WIDTHS["desktop"], "height": 900})


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
    # Times are shown in the browser's time zone by the page's script, not as UTC text.
    checked = page.locator("table time").first
    await expect(checked).not_to_contain_text("UTC")
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
    await context.close()


async def test_the_api_docs_render_under_their_security_policy(api: Api, chromium: Any) -> None:
    """Swagger UI, on the dashboard's origin, works with scripts from here only."""
    base = str(api.client.make_url("")).rstrip("/")
    context = await chromium.new_context(viewport={"width": 1280, "height": 900})
    visitor = Visitor(await context.new_page(), base)
    await visitor.open("/api/v1/docs")
    expect = playwright_api.expect
    await expect(visitor.page.get_by_text("/api/v1/proxy/{server_id}/mcp").first).to_be_visible()
    await visitor.photograph("api-docs")
    assert visitor.problems == []
    await context.close()
