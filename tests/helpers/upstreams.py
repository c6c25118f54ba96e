"""Real upstream MCP peers for tests: the official SDK server in a subprocess, a scriptable fake."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

SDK_SERVER_SCRIPT = Path(__file__).with_name("sdk_server.py")
SDK_TOOL_NAMES = frozenset({"add", "echo", "fail", "slow", "region_of", "polled", "register_tool"})
_STARTUP_SECONDS = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def unused_url() -> str:
    """An MCP URL where the connection is refused."""
    return f"http://127.0.0.1:{free_port()}/mcp"


@contextlib.contextmanager
def sdk_server(
    *,
    stateless: bool = False,
    json_response: bool = False,
    priming: bool = False,
    page_size: int | None = None,
    transport: str = "streamable-http",
    interactive: bool = False,
    otlp_endpoint: str | None = None,
) -> Iterator[str]:
    """Run tests/sdk_server.py (official `mcp` SDK) on a free port; yield its MCP URL.

    Synchronous on purpose, so session-scoped fixtures in any test package can share one
    process. `priming` adds an event store (priming events, `retry:` lines, resumable
    streams); `transport="sse"` runs the legacy HTTP+SSE transport and yields its /sse URL;
    `interactive` adds a tool that elicits and one that becomes a task (the tasks extension);
    `otlp_endpoint` (a tests.helpers.otlp Collector's) has the server export its spans there
    and adds the `trace_headers` tool, which answers with the trace headers it received.
    """
    port = free_port()
    args = [sys.executable, str(SDK_SERVER_SCRIPT), str(port), "--transport", transport]
    args += ["--stateless"] if stateless else []
    args += ["--json"] if json_response else []
    args += ["--priming"] if priming else []
    args += ["--page-size", str(page_size)] if page_size else []
    args += ["--interactive"] if interactive else []
    args += ["--otlp-endpoint", otlp_endpoint] if otlp_endpoint else []
    with running(args, lambda proc, log: _wait_for_port(proc, port, log)):
        path = "/sse" if transport == "sse" else "/mcp"
        yield f"http://127.0.0.1:{port}{path}"


@contextlib.contextmanager
def running(
    args: list[str], ready: Callable[[subprocess.Popen[bytes], Any], None]
) -> Iterator[subprocess.Popen[bytes]]:
    """A server process (its output kept in a temporary file, for `ready` to show when it
    fails to start) until the block ends; stopped by its PID, killed if it lingers."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            ready(proc, log)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _wait_for_port(proc: subprocess.Popen[bytes], port: int, log: Any) -> None:
    deadline = time.monotonic() + _STARTUP_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            output = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"SDK server exited with {proc.returncode}:\n{output}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"SDK server did not listen on port {port} within {_STARTUP_SECONDS} s")


def default_tools() -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "description": f"fake tool {name}",
            "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}},
        }
        for name in ("alpha", "bravo", "charlie", "delta", "echo")
    ]


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the fake received it (headers kept, for credential assertions)."""

    method: str
    path: str
    headers: CIMultiDict[str]
    body: Any

    @property
    def rpc_method(self) -> str | None:
        return self.body.get("method") if isinstance(self.body, dict) else None


@dataclass
class FakeUpstream:
    """A streamable-HTTP MCP server of the handshake era (no 2026-07-28), with fault switches.

    Every switch is read per request, so a test may flip one while the server runs.
    """

    tools: list[dict[str, Any]] = field(default_factory=default_tools)
    page_size: int | None = None
    # Answer requests with SSE streams: priming event, retry line, comment, a notification
    # and the response spread over several `data:` lines.
    sse: bool = False
    delay: float = 0.0
    status: int | None = None
    rpc_error: tuple[int, str] | None = None
    html_body: bool = False
    required_headers: dict[str, str] = field(default_factory=dict)
    legacy_sse: bool = False
    # Forget a session as soon as it is used for a request, like an upstream restarting nonstop.
    expire_sessions: bool = False
    protocol_version: str = "2025-11-25"
    requests: list[RecordedRequest] = field(default_factory=list)
    sessions: set[str] = field(default_factory=set)
    deleted_sessions: list[str] = field(default_factory=list)
    url: str = ""

    def rpc_methods(self) -> list[str | None]:
        return [r.rpc_method for r in self.requests if r.method == "POST"]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        self.requests.append(
            RecordedRequest(request.method, request.path, CIMultiDict(request.headers), body)
        )
        if any(request.headers.get(k) != v for k, v in self.required_headers.items()):
            return web.json_response({"detail": "missing or wrong credentials"}, status=401)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.status is not None:
            return web.Response(status=self.status, text="upstream trouble")
        if self.html_body:
            return web.Response(text="<html>a login page</html>", content_type="text/html")
        if self.legacy_sse:
            return await self._legacy(request)
        if request.method == "DELETE":
            session = request.headers.get("Mcp-Session-Id", "")
            self.sessions.discard(session)
            self.deleted_sessions.append(session)
            return web.Response(status=200)
        if request.method != "POST":
            return web.Response(status=405, headers={"Allow": "POST, DELETE"})
        return await self._rpc(request, body)

    async def _rpc(self, request: web.Request, body: Any) -> web.StreamResponse:
        if not isinstance(body, dict) or "method" not in body:
            return _rpc_error_response(None, -32700, "Parse error", 400)
        method, rid = body["method"], body.get("id")
        if method == "initialize":
            session = uuid.uuid4().hex
            self.sessions.add(session)
            result: dict[str, Any] = {
                "protocolVersion": self.protocol_version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "fake-upstream", "version": "1"},
            }
            return await self._reply(
                request, {"jsonrpc": "2.0", "id": rid, "result": result}, session
            )
        # Like a pre-2026 stateful SDK server: this is also how server/discover gets refused.
        session_id = request.headers.get("Mcp-Session-Id")
        if session_id is None:
            return _rpc_error_response(None, -32600, "Bad Request: Missing session ID", 400)
        if session_id not in self.sessions or (self.expire_sessions and rid is not None):
            return _rpc_error_response(None, -32600, "Session not found", 404)
        if rid is None:
            return web.Response(status=202)
        if method == "tools/list":
            if self.rpc_error is not None:
                code, message = self.rpc_error
                error = {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}
                return await self._reply(request, error, None)
            cursor = (body.get("params") or {}).get("cursor")
            start = int(cursor) if cursor else 0
            end = start + self.page_size if self.page_size else len(self.tools)
            result = {"tools": self.tools[start:end]}
            if end < len(self.tools):
                result["nextCursor"] = str(end)
            return await self._reply(request, {"jsonrpc": "2.0", "id": rid, "result": result}, None)
        if method == "tools/call":
            params = body.get("params") or {}
            text = orjson.dumps(params.get("arguments") or {}).decode()
            result = {"content": [{"type": "text", "text": text}], "isError": False}
            return await self._reply(request, {"jsonrpc": "2.0", "id": rid, "result": result}, None)
        return _rpc_error_response(rid, -32601, "Method not found", 200)

    async def _reply(
        self, request: web.Request, message: dict[str, Any], session: str | None
    ) -> web.StreamResponse:
        headers = {"Mcp-Session-Id": session} if session else {}
        if not self.sse:
            return web.json_response(
                message, headers=headers, dumps=lambda o: orjson.dumps(o).decode()
            )
        resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream"})
        await resp.prepare(request)
        progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
        pretty = orjson.dumps(message, option=orjson.OPT_INDENT_2).decode().split("\n")
        stream = (
            "id: 7\r\nretry: 2500\r\ndata:\r\n\r\n"
            ": keep-alive comment\n\n"
            f"event: message\ndata: {orjson.dumps(progress).decode()}\n\n"
            "id: 8\r\nevent: message\r\n" + "".join(f"data: {line}\r\n" for line in pretty) + "\r\n"
        ).encode()
        # Small writes so events arrive split across chunks.
        for i in range(0, len(stream), 97):
            await resp.write(stream[i : i + 97])
        await resp.write_eof()
        return resp

    async def _legacy(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            return web.Response(status=405, headers={"Allow": "GET"})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"event: endpoint\r\ndata: /messages/?session_id=abc\r\n\r\n")
        # Hold the stream open like a real legacy server, until the client goes away.
        for _ in range(200):
            if request.transport is None or request.transport.is_closing():
                break
            await asyncio.sleep(0.05)
        return resp


def _rpc_error_response(rid: Any, code: int, message: str, status: int) -> web.Response:
    body = {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}
    return web.json_response(body, status=status)


@contextlib.asynccontextmanager
async def serve_loopback(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 (a free port) for the block; yields its base URL."""
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def fake_upstream(**behaviour: Any) -> AsyncIterator[FakeUpstream]:
    """Serve a `FakeUpstream` on 127.0.0.1 (free port) at /mcp for the duration of the block."""
    fake = FakeUpstream(**behaviour)
    app = web.Application()
    app.router.add_route("*", "/mcp", fake.handle)
    async with serve_loopback(app) as base_url:
        fake.url = f"{base_url}/mcp"
        yield fake
