"""The OAuth authorization-code flow over HTTP, as a client and a person in a browser run it:
register a client, sign in to the dashboard, open /oauth/authorize, press Allow (or Deny) on
the consent page, take the code from the redirect, exchange it with the PKCE verifier.

Works against any gateway URL with an aiohttp ClientSession that keeps cookies (a test app's
`api.client.session` and `str(api.client.make_url(""))`, or a real server's). The gateway's
PUBLIC_URL must be loopback or https for OAuth to be on (`OAUTH_PUBLIC_URL` for test apps).
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from yarl import URL

# A PUBLIC_URL under which test apps serve OAuth (loopback, so plain http is allowed, and
# without https the dashboard's cookies reach the test client).
OAUTH_PUBLIC_URL = "http://localhost"
REDIRECT_URI = "http://127.0.0.1:33418/callback"

_HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)">')


def pkce() -> tuple[str, str]:
    """A code verifier and its S256 challenge."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def mcp_url(public_url: str, server_id: str, kind: str = "proxy") -> str:
    """The resource a token is asked for: a server's (kind "proxy") or toolset's MCP URL."""
    return f"{public_url}/api/v1/{kind}/{server_id}/mcp"


def hidden_fields(page: str) -> list[tuple[str, str]]:
    return [(name, html.unescape(value)) for name, value in _HIDDEN.findall(page)]


@dataclass
class Reply:
    status: int
    body: Any
    headers: Any

    @property
    def location(self) -> URL:
        return URL(self.headers["Location"])


@dataclass
class AuthorizationRequest:
    client_id: str
    resource: str
    redirect_uri: str = REDIRECT_URI
    state: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    verifier: str = ""
    challenge: str = ""
    method: str | None = "S256"
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.verifier:
            self.verifier, self.challenge = pkce()

    def query(self) -> dict[str, str]:
        params = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": self.redirect_uri,
            "state": self.state,
            "resource": self.resource,
        }
        if self.challenge:
            params["code_challenge"] = self.challenge
        if self.method is not None:
            params["code_challenge_method"] = self.method
        params.update(self.extra)
        return {k: v for k, v in params.items() if v is not None}


class OAuthHttp:
    """The flow's HTTP steps against the gateway at `base` (no trailing slash)."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base.rstrip("/")

    async def _call(self, method: str, path: str, **kw: Any) -> Reply:
        url = path if path.startswith("http") else self.base + path
        async with self.session.request(method, url, allow_redirects=False, **kw) as response:
            raw = await response.read()
            body: Any = raw.decode(errors="replace")
            if response.content_type == "application/json" and raw:
                body = await response.json()
            return Reply(response.status, body, response.headers)

    async def register(
        self, redirect_uris: list[str] | None = None, name: str | None = "Test client", **more: Any
    ) -> Reply:
        body: dict[str, Any] = {"redirect_uris": redirect_uris or [REDIRECT_URI], **more}
        if name is not None:
            body["client_name"] = name
        return await self._call("POST", "/oauth/register", json=body)

    async def client_id(self, **kw: Any) -> str:
        reply = await self.register(**kw)
        assert reply.status == 201, reply.body
        client_id: str = reply.body["client_id"]
        return client_id

    async def sign_in(
        self, email: str, password: str = "password123", next_page: str = "/"
    ) -> Reply:
        """Sign in to the dashboard (signing out whoever was signed in first)."""
        page = await self._call("GET", "/login")
        if page.status == 303:  # signed in already
            account = await self._call("GET", "/account")
            token = dict(hidden_fields(account.body))["csrf_token"]
            await self._call("POST", "/logout", data={"csrf_token": token})
            page = await self._call("GET", "/login")
        fields = dict(hidden_fields(page.body))
        form = {**fields, "email": email, "password": password, "next": next_page}
        reply = await self._call("POST", "/login", data=form)
        assert reply.status == 303, f"sign in failed: {reply.status} {reply.body[:500]}"
        return reply

    async def authorize_page(self, request: AuthorizationRequest) -> Reply:
        """GET /oauth/authorize (not followed: a redirect to the login or the client)."""
        return await self._call("GET", "/oauth/authorize", params=request.query())

    async def decide(self, page: str, decision: str = "allow") -> Reply:
        """Press Allow or Deny on a consent page (its hidden fields, CSRF token included)."""
        form = [*hidden_fields(page), ("decision", decision)]
        return await self._call("POST", "/oauth/authorize", data=form)

    async def authorize(self, request: AuthorizationRequest, decision: str = "allow") -> Reply:
        """Signed in already: the consent page, then the decision; the redirect to the client."""
        page = await self.authorize_page(request)
        assert page.status == 200, f"no consent page: {page.status} {page.body!r:.500}"
        return await self.decide(page.body, decision)

    async def exchange(
        self, request: AuthorizationRequest, code: str, **overrides: str | None
    ) -> Reply:
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": request.redirect_uri,
            "client_id": request.client_id,
            "code_verifier": request.verifier,
            "resource": request.resource,
        }
        form.update(overrides)  # type: ignore[arg-type]
        return await self._call(
            "POST", "/oauth/token", data={k: v for k, v in form.items() if v is not None}
        )

    async def refresh(
        self, client_id: str, refresh_token: str, resource: str | None = None
    ) -> Reply:
        form = {"grant_type": "refresh_token", "refresh_token": refresh_token}
        form["client_id"] = client_id
        if resource is not None:
            form["resource"] = resource
        return await self._call("POST", "/oauth/token", data=form)

    async def revoke(self, client_id: str, token: str) -> Reply:
        return await self._call(
            "POST", "/oauth/revoke", data={"token": token, "client_id": client_id}
        )

    async def code_for(self, request: AuthorizationRequest) -> str:
        reply = await self.authorize(request)
        assert reply.status == 302, reply
        query = reply.location.query
        assert query.get("state") == request.state and "code" in query, str(reply.location)
        return query["code"]

    async def tokens(
        self, email: str, resource: str, password: str = "password123", **client: Any
    ) -> tuple[AuthorizationRequest, dict[str, Any]]:
        """The whole flow for a new client: register, sign in, consent, exchange."""
        client_id = await self.client_id(**client)
        await self.sign_in(email, password)
        request = AuthorizationRequest(client_id, resource)
        code = await self.code_for(request)
        reply = await self.exchange(request, code)
        assert reply.status == 200, reply.body
        return request, reply.body
