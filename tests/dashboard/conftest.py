"""A browser-like client for the dashboard's pages: its own cookies, forms sent with their
CSRF token, the way a person's browser would (without running the page's script)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.helpers.api import Account, Api
from tests.helpers.browser import Browser, BrowserFactory


@pytest.fixture
async def browser_for(api: Api) -> AsyncIterator[BrowserFactory]:
    """browser_for(account) is a browser logged in as that account (None: signed out)."""
    opened: list[Browser] = []

    async def make(account: Account | None = None) -> Browser:
        browser = Browser(api)
        opened.append(browser)
        if account is not None:
            await browser.log_in(account.email)
            # The pages show the workspace the account's tokens are scoped to.
            await browser.post("/switch", {"workspace_id": account.workspace_id}, expect=200)
        return browser

    yield make
    for browser in opened:
        await browser.close()


@pytest.fixture
async def chromium() -> AsyncIterator[Any]:
    """Headless Chromium (tests/helpers/chromium.py); its tests skip without one."""
    from tests.helpers.chromium import launched  # Playwright only for the tests that use it

    async with launched() as browser:
        yield browser
