"""A real browser in tests: headless Chromium (Debian's `chromium`) driven by Playwright.

Playwright cannot download its own browser here, so it drives the system's: without one the
tests that need it skip, saying how to get it (`apt-get install chromium`; `.ci/run` does).
Pages are photographed at desktop and phone width into the artifacts directory
(TEST_ARTIFACTS_DIR, default test-artifacts/ beside this repository's README).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.api import Account

playwright_api = pytest.importorskip(
    "playwright.async_api", reason="pip install playwright (in the test extras)"
)

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium")
# Marks a test (or a module, as its pytestmark) that drives Chromium.
needs_chromium = pytest.mark.skipif(
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


@contextlib.asynccontextmanager
async def launched() -> AsyncIterator[Any]:
    """Chromium, closed at the end (the `chromium` fixture of tests/dashboard/conftest.py)."""
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


async def signed_in(
    browser: Any, base: str, account: Account, width: int, **context: Any
) -> Visitor:
    """A visitor who logged in through the form (password123) and sees the overview; `context`
    goes to Playwright's new_context (permissions, say)."""
    context = {"viewport": {"width": width, "height": 900}, **context}
    visitor = Visitor(await (await browser.new_context(**context)).new_page(), base)
    page = visitor.page
    await visitor.open("/login")
    await page.get_by_label("Email").fill(account.email)
    await page.get_by_label("Password").fill("password123")
    await page.get_by_role("button", name="Log in").click()
    await playwright_api.expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    return visitor


# Every visible control, label, cell and badge of the page's main part that reaches past the
# screen's edges.
_OUTSIDE = """(width) => {
  const outside = [];
  for (const node of document.querySelectorAll(
      "main input, main select, main textarea, main label, main button, main .button, "
      + "main td, main .badge, main .check, main legend, main h1, main .error")) {
    const box = node.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;  // not shown
    if (node.type === "hidden") continue;
    if (box.left < -0.5 || box.right > width + 0.5) {
      outside.push(`${node.tagName} "${(node.textContent || node.name || "").trim().slice(0, 40)}" `
                   + `${Math.round(box.left)}..${Math.round(box.right)}`);
    }
  }
  return outside;
}"""


async def fits_a_phone(visitor: Visitor, name: str, width: int) -> None:
    """Photographed at the visitor's width and at 390 px, where nothing of the page's main
    part is cut off, and the page does not scroll sideways."""
    page = visitor.page
    device = next(d for d, w in WIDTHS.items() if w == width)
    await page.screenshot(path=ARTIFACTS / f"{name}-{device}.png", full_page=True)
    phone = WIDTHS["phone"]
    await page.set_viewport_size({"width": phone, "height": 900})
    try:
        if device != "phone":
            await page.screenshot(path=ARTIFACTS / f"{name}-phone.png", full_page=True)
        outside = await page.evaluate(_OUTSIDE, phone)
        assert outside == [], (name, outside)
        overflow = await page.evaluate("document.documentElement.scrollWidth - innerWidth")
        assert overflow <= 1, f"{name} is {overflow}px wider than a phone"
    finally:
        await page.set_viewport_size({"width": width, "height": 900})
