"""OAuth consent in a real browser, in tests: the person at Chromium who signs in to the
dashboard when asked and answers the consent page, and the client's loopback redirect URI
(RFC 8252) that takes the authorization response.

`Consent` gives the official SDK's `OAuthClientProvider` its two handlers: `redirect_handler`
opens the authorization URL in a fresh Chromium context (no cookies: the person signs in
through the login page), answers the consent page, and follows the redirect to the loopback
server; `callback_handler` returns what reached that server (code, state, iss).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from mcp.client.auth import AuthorizationCodeResult, OAuthFlowError
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from tests.helpers.chromium import ARTIFACTS, playwright_api
from tests.helpers.upstreams import serve_loopback

# Each browser step waits at most this long (ms), so a page that never shows what the person
# looks for fails the test quickly instead of at pytest's timeout.
_STEP_MS = 10_000
_CALLBACK_SECONDS = 15.0


class Redirected(OAuthFlowError):
    """The authorization response was an error (`error=access_denied` after Deny, say)."""

    def __init__(self, query: dict[str, str]) -> None:
        super().__init__(f"authorization failed: {query}")
        self.query = query


class LoopbackRedirect:
    """A native client's redirect URI, `http://127.0.0.1:<port>/callback`: each request that
    reaches it is an authorization response, queued for the client."""

    def __init__(self) -> None:
        self.base_url = ""
        self.responses: asyncio.Queue[dict[str, str]] = asyncio.Queue()

    @property
    def redirect_uri(self) -> str:
        return f"{self.base_url}/callback"

    async def _handle(self, request: web.Request) -> web.Response:
        self.responses.put_nowait(dict(request.query))
        return web.Response(text="You may close this window.", content_type="text/plain")

    async def next_response(self) -> dict[str, str]:
        return await asyncio.wait_for(self.responses.get(), _CALLBACK_SECONDS)


@contextlib.asynccontextmanager
async def loopback_redirect() -> AsyncIterator[LoopbackRedirect]:
    redirect = LoopbackRedirect()
    app = web.Application()
    app.router.add_get("/callback", redirect._handle)
    async with serve_loopback(app) as base_url:
        redirect.base_url = base_url
        yield redirect


class Consent:
    """A person (an account's email, password123) at Chromium answering consent pages with
    `answer` ("Allow" or "Deny"); what each consent page said is kept in `pages`, and what
    went wrong in the browser on the way (script errors, CSP violations, dialogs, a 5xx) in
    `problems`."""

    def __init__(
        self,
        chromium: Any,
        redirect: LoopbackRedirect,
        email: str,
        *,
        password: str = "password123",
        answer: str = "Allow",
        photograph: str | None = None,
    ) -> None:
        self.chromium = chromium
        self.redirect = redirect
        self.email = email
        self.password = password
        self.answer = answer
        self.photograph = photograph
        self.pages: list[str] = []
        self.problems: list[str] = []
        self.signed_in = 0

    async def redirect_handler(self, authorization_url: str) -> None:
        """Open the authorization URL as a person would: sign in if the gateway asks, answer
        the consent page, and let the browser follow the redirect to the loopback server."""
        context = await self.chromium.new_context(viewport={"width": 1280, "height": 900})
        try:
            page = await context.new_page()
            page.set_default_timeout(_STEP_MS)
            self._watch(page)
            await page.goto(authorization_url)
            button = page.get_by_role("button", name=self.answer, exact=True)
            if await page.get_by_label("Password").count():
                await self._sign_in(page)
                if not await button.count():
                    # The login page may land on the dashboard rather than back here.
                    await page.goto(authorization_url)
            await playwright_api.expect(button).to_be_visible()
            self.pages.append(await page.locator("body").inner_text())
            if self.photograph:
                # At a desktop's width and a phone's, a long client id or MCP URL must wrap
                # inside the card, not run past its edge.
                for width, suffix in ((1280, ""), (390, "-phone")):
                    await page.set_viewport_size({"width": width, "height": 900})
                    path = ARTIFACTS / f"{self.photograph}{suffix}.png"
                    await page.screenshot(path=path, full_page=True)
                    for outside in await page.evaluate(_OUTSIDE_THE_CARD):
                        self.problems.append(f"past the card's edge at {width} px: {outside}")
            redirect_uri = self.redirect.redirect_uri
            async with page.expect_navigation(url=lambda url: url.startswith(redirect_uri)):
                await button.click()
        finally:
            await context.close()

    def _watch(self, page: Any) -> None:
        def console(message: Any) -> None:
            # Answers with a 4xx status are logged too; a test that makes one checks it itself.
            if message.type == "error" and not message.text.startswith("Failed to load"):
                self.problems.append(message.text)

        async def dialog(opened: Any) -> None:
            self.problems.append(f"a {opened.type} dialog: {opened.message}")
            await opened.dismiss()

        def response(answer: Any) -> None:
            if answer.status >= 500:
                self.problems.append(f"{answer.status} from {answer.url}")

        page.on("console", console)
        page.on("pageerror", lambda error: self.problems.append(f"script error: {error}"))
        page.on("dialog", dialog)
        page.on("response", response)

    async def _sign_in(self, page: Any) -> None:
        await page.get_by_label("Email").fill(self.email)
        await page.get_by_label("Password").fill(self.password)
        async with page.expect_navigation():
            await page.get_by_role("button", name="Log in").click()
        self.signed_in += 1

    async def callback_handler(self) -> AuthorizationCodeResult:
        query = await self.redirect.next_response()
        if "code" not in query:
            raise Redirected(query)
        return AuthorizationCodeResult(
            code=query["code"], state=query.get("state"), iss=query.get("iss")
        )


# What on the page's cards reaches past their right edge.
_OUTSIDE_THE_CARD = """() => {
  const outside = [];
  for (const card of document.querySelectorAll("main .card")) {
    const edge = card.getBoundingClientRect().right;
    for (const node of card.querySelectorAll("*")) {
      const box = node.getBoundingClientRect();
      if (box.width > 0 && box.right > edge + 0.5) {
        outside.push(`${node.tagName} "${node.textContent.trim().slice(0, 40)}"`);
      }
    }
  }
  return outside;
}"""


class MemoryStorage:
    """The SDK client's TokenStorage, in memory: what a client keeps between connections."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info
