"""A small client for the API in tests: requests with auth, and common arrangements."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient
from multidict import CIMultiDictProxy

_counter = itertools.count(1)


@dataclass
class Reply:
    status: int
    body: Any
    headers: CIMultiDictProxy[str]

    @property
    def detail(self) -> str:
        assert isinstance(self.body, dict), self.body
        detail: str = self.body["detail"]
        return detail


@dataclass
class Account:
    user_id: str
    email: str
    workspace_id: str
    access_token: str
    refresh_token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.access_token}"}

    def scoped(self, tokens: dict[str, Any]) -> Account:
        """The same user with tokens from a TokenResponse."""
        return Account(
            self.user_id,
            self.email,
            tokens["workspace"]["id"],
            tokens["access_token"],
            tokens["refresh_token"],
        )


Credential = Account | str | None  # an account (JWT), a raw API key, or anonymous


# Routes of the app outside /api/v1 that tests name by their bare path (or its start).
OUTSIDE_THE_API = ("/healthz", "/readyz", "/oauth/", "/.well-known/")


class Api:
    def __init__(self, client: TestClient[web.Request, web.Application]) -> None:
        self.client = client
        self.app = client.app

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | str | None = None,
        auth: Credential = None,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        expect: int | None = None,
    ) -> Reply:
        all_headers = dict(headers or {})
        if data is not None:  # raw bodies in the tests are (attempts at) JSON
            all_headers.setdefault("Content-Type", "application/json")
        if isinstance(auth, Account):
            all_headers.update(auth.headers)
        elif isinstance(auth, str):
            all_headers["X-API-Key"] = auth
        inside = path.startswith("/") and not path.startswith(("/api/", *OUTSIDE_THE_API))
        url = f"/api/v1{path}" if inside else path
        async with self.client.request(
            method, url, json=json, data=data, headers=all_headers, params=params
        ) as response:
            raw = await response.read()
            body: Any = None
            if raw and response.content_type == "application/json":
                body = await response.json()
            elif raw:
                body = raw.decode(errors="replace")
            reply = Reply(response.status, body, response.headers)
        if expect is not None:
            assert reply.status == expect, f"{method} {path}: {reply.status} {reply.body!r}"
        return reply

    async def get(self, path: str, **kw: Any) -> Reply:
        return await self.request("GET", path, **kw)

    async def post(self, path: str, **kw: Any) -> Reply:
        return await self.request("POST", path, **kw)

    async def patch(self, path: str, **kw: Any) -> Reply:
        return await self.request("PATCH", path, **kw)

    async def delete(self, path: str, **kw: Any) -> Reply:
        return await self.request("DELETE", path, **kw)

    # -- arrangements -------------------------------------------------------------------------

    async def signup(
        self,
        email: str | None = None,
        *,
        name: str = "Test User",
        password: str = "password123",
        invite_token: str | None = None,
    ) -> Account:
        email = email or f"user{next(_counter)}@example.com"
        body: dict[str, Any] = {"email": email, "password": password, "name": name}
        if invite_token is not None:
            body["invite_token"] = invite_token
        reply = await self.post("/auth/signup", json=body, expect=201)
        tokens = reply.body
        return Account(
            tokens["user"]["id"],
            tokens["user"]["email"],
            tokens["workspace"]["id"],
            tokens["access_token"],
            tokens["refresh_token"],
        )

    async def org(self, owner: Account, name: str = "Acme") -> Account:
        """Create an org workspace; returns the owner with tokens scoped to it."""
        created = await self.post("/workspaces", json={"name": name}, auth=owner, expect=201)
        switched = await self.post(
            "/auth/switch-workspace",
            json={"workspace_id": created.body["id"]},
            auth=owner,
            expect=200,
        )
        return owner.scoped(switched.body)

    async def invite(self, admin: Account, email: str, role: str = "member") -> dict[str, Any]:
        reply = await self.post(
            f"/workspaces/{admin.workspace_id}/members/invite",
            json={"email": email, "role": role},
            auth=admin,
            expect=201,
        )
        invite: dict[str, Any] = reply.body
        return invite

    async def member(self, admin: Account, role: str = "member") -> Account:
        """A new user who joined admin's current workspace with `role` (owner via promotion)."""
        email = f"user{next(_counter)}@example.com"
        invite_role = "member" if role == "owner" else role
        invite = await self.invite(admin, email, invite_role)
        account = await self.signup(email, invite_token=invite["invite_url"].rsplit("/", 1)[1])
        assert account.workspace_id == admin.workspace_id
        if role == "owner":
            await self.patch(
                f"/workspaces/{admin.workspace_id}/members/{account.user_id}",
                json={"role": "owner"},
                auth=admin,
                expect=200,
            )
        return account

    async def api_key(self, admin: Account, name: str = "key") -> str:
        reply = await self.post(
            f"/workspaces/{admin.workspace_id}/api-keys",
            json={"name": name},
            auth=admin,
            expect=201,
        )
        key: str = reply.body["key"]
        return key


AppFactory = Callable[..., Awaitable[Api]]
