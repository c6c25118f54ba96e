"""The dashboard in tests: a signed-in browser of plain HTTP requests (forms with their CSRF
tokens, pages parsed)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from html import unescape
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

from tests.helpers.api import Api


@dataclass
class Page:
    status: int
    text: str
    headers: CIMultiDictProxy[str]
    url: str

    @property
    def csrf(self) -> str:
        found = _CSRF.search(self.text)
        assert found is not None, f"no form with a CSRF token on {self.url}"
        return found.group(1)

    def has(self, text: str) -> bool:
        """Whether the page shows this text (HTML entities decoded)."""
        return text in unescape(self.text)


class Browser:
    """One person's browser: a cookie jar, and the last page seen (for its forms' token)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
        self.last: Page | None = None

    @property
    def csrf(self) -> str:
        """The CSRF token of the last page seen."""
        assert self.last is not None, "no page seen yet"
        return self.last.csrf

    def url(self, path: str) -> str:
        return str(self.api.client.make_url(path))

    async def get(self, path: str, *, expect: int | None = 200) -> Page:
        async with self.http.get(self.url(path), allow_redirects=True) as response:
            page = Page(response.status, await response.text(), response.headers, str(response.url))
        if expect is not None:
            assert page.status == expect, f"GET {path}: {page.status}\n{page.text[:2000]}"
        if page.status < 400:
            self.last = page
        return page

    async def post(
        self,
        path: str,
        data: dict[str, Any] | list[tuple[str, str]] | None = None,
        *,
        csrf: str | None = None,
        expect: int | None = None,
        follow: bool = True,
    ) -> Page:
        """Send a form, with the CSRF token of the last page seen unless one is given; a list
        of pairs sends a field several times (checkboxes of one name)."""
        token = csrf if csrf is not None else (self.csrf if self.last else "")
        form: dict[str, Any] | list[tuple[str, str]]
        if isinstance(data, list):
            form = [("csrf_token", token), *data]
        else:
            form = {"csrf_token": token, **(data or {})}
        async with self.http.post(self.url(path), data=form, allow_redirects=follow) as response:
            page = Page(response.status, await response.text(), response.headers, str(response.url))
        if expect is not None:
            assert page.status == expect, f"POST {path}: {page.status}\n{page.text[:2000]}"
        if page.status < 400:
            self.last = page
        return page

    async def log_in(self, email: str, password: str = "password123") -> Page:
        await self.get("/login")
        return await self.post("/login", {"email": email, "password": password}, expect=200)

    async def close(self) -> None:
        await self.http.close()


BrowserFactory = Callable[..., Awaitable[Browser]]


_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
