"""Proxying in tests: servers arranged as POST /servers stores them, calls to send, the rows
the call log wrote, a scriptable upstream that records what reaches it, the SDK client."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx2
import orjson
from aiohttp import web
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from multidict import CIMultiDict

from gateway.security.secretbox import SECRET_BOX
from tests.helpers.api import Account, Api
from tests.helpers.upstreams import serve_loopback

AppFactory = Callable[..., Awaitable[Api]]
ACCEPT = "application/json, text/event-stream"


# -- arrangements ------------------------------------------------------------------------------


async def add_server(
    api: Api,
    db: asyncpg.Connection,
    owner: Account,
    url: str,
    auth_type: str | None = None,
    credentials: dict[str, str] | None = None,
) -> str:
    """A server row, as POST /servers would store it."""
    sealed = None if credentials is None else api.app[SECRET_BOX].seal(credentials)
    server_id = await db.fetchval(
        "INSERT INTO servers (workspace_id, name, url, auth_type, credentials) "
        "VALUES ($1, $2, $3, $4, $5) RETURNING id",
        uuid.UUID(owner.workspace_id),
        f"server-{secrets.token_hex(4)}",
        url,
        auth_type,
        sealed,
    )
    return str(server_id)


async def logged_calls(db: asyncpg.Connection, count: int, within: float = 10.0) -> list[Any]:
    """The tool_calls rows once there are `count` of them (the log is written in the background)."""
    deadline = time.monotonic() + within
    while True:
        rows = await db.fetch("SELECT * FROM tool_calls ORDER BY created_at, id")
        if len(rows) >= count or time.monotonic() > deadline:
            assert len(rows) == count, rows
            return rows
        await asyncio.sleep(0.02)


def rpc(method: str, params: dict[str, Any] | None = None, rid: int | None = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    if rid is not None:
        message["id"] = rid
    return message


def call(name: str, rid: int = 1, **arguments: Any) -> dict[str, Any]:
    return rpc("tools/call", {"name": name, "arguments": arguments}, rid)


@dataclass
class Setup:
    api: Api
    owner: Account
    key: str
    server_id: str

    @property
    def path(self) -> str:
        return f"/proxy/{self.server_id}/mcp"

    @property
    def url(self) -> str:
        return str(self.api.client.make_url(f"/api/v1{self.path}"))

    def stream(self, message: Any) -> Any:
        """POST a message with the API key, for reading the reply as it streams:
        `async with setup.stream(call("x")) as response: ...`."""
        return self.api.client.post(
            f"/api/v1{self.path}", json=message, headers={"X-API-Key": self.key, "Accept": ACCEPT}
        )


async def arrange(api: Api, db: asyncpg.Connection, url: str, **server: Any) -> Setup:
    owner = await api.signup()
    key = await api.api_key(owner)
    server_id = await add_server(api, db, owner, url, **server)
    return Setup(api, owner, key, server_id)


# -- a scriptable upstream that records requests -----------------------------------------------


@dataclass
class Recorder:
    """An MCP-ish upstream: answers JSON-RPC (objects and batches) with JSON, or as scripted."""

    url: str = ""
    requests: list[tuple[str, CIMultiDict[str], bytes]] = field(default_factory=list)
    delay: float = 0.0
    status: int = 200
    # Called instead of the default answer when set.
    script: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append((request.method, CIMultiDict(request.headers), body))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.script is not None:
            return await self.script(request)
        if request.method != "POST":
            return web.Response(status=405, headers={"Allow": "POST"})
        if self.status != 200:
            return web.json_response({"error": "scripted"}, status=self.status)
        message = orjson.loads(body)
        if isinstance(message, list):
            answer: Any = [self._answer(m) for m in message if "id" in m]
        elif "id" not in message:
            return web.Response(status=202)
        else:
            answer = self._answer(message)
        return web.Response(
            body=orjson.dumps(answer),
            content_type="application/json",
            headers={"Mcp-Session-Id": "session-1", "X-Upstream-Secret": "internal"},
        )

    @staticmethod
    def _answer(message: dict[str, Any]) -> dict[str, Any]:
        text = orjson.dumps(message.get("params", {}).get("arguments", {})).decode()
        result = {"content": [{"type": "text", "text": text}], "isError": False}
        return {"jsonrpc": "2.0", "id": message["id"], "result": result}

    @property
    def last_headers(self) -> CIMultiDict[str]:
        return self.requests[-1][1]


@contextlib.asynccontextmanager
async def recorder(**behaviour: Any) -> AsyncIterator[Recorder]:
    upstream = Recorder(**behaviour)
    app = web.Application()
    app.router.add_route("*", "/mcp", upstream.handle)
    async with serve_loopback(app) as base_url:
        upstream.url = f"{base_url}/mcp"
        yield upstream


def sdk_client(url: str, key: str, mode: str, **headers: str) -> Client:
    http = httpx2.AsyncClient(headers={"X-API-Key": key, **headers}, timeout=30)
    return Client(streamable_http_client(url, http_client=http), mode=mode)
