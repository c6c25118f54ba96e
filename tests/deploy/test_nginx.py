"""deploy/nginx.conf in front of two gateway replicas, as docker-compose.yml runs them: MCP
through it with the official SDK client, no sticky sessions, SSE passed on event by event.

The config is deploy/nginx.conf itself, with only its addresses and paths changed: the two
replicas are `mcp-gateway serve` processes on loopback ports, nginx listens on a free loopback
port and keeps its files under a temporary prefix. Skipped where no nginx binary is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from tests.helpers.processes import SECRETS, environment
from tests.helpers.proxying import sdk_client
from tests.helpers.upstreams import free_port, serve_loopback

NGINX = shutil.which("nginx") or next(
    (path for path in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(path, os.X_OK)),
    None,
)
CONF = Path(__file__).resolve().parents[2] / "deploy" / "nginx.conf"
# Hang guards, not timings: starting Python on a loaded 2-core machine takes seconds.
STARTUP_SECONDS = 60.0
STOP_SECONDS = 30.0
READ_SECONDS = 20.0
ACCEPT = "application/json, text/event-stream"

pytestmark = pytest.mark.skipif(
    NGINX is None, reason="install nginx to run (apt-get install nginx): no nginx binary found"
)


# -- the config: deploy/nginx.conf with loopback addresses and a private prefix ---------------


def private_config(conf: str, listen: int, replicas: list[int], prefix: Path) -> str:
    """`conf` with the replicas at 127.0.0.1:`replicas`, listening on 127.0.0.1:`listen`, and
    every file nginx writes under `prefix`; nothing else changed."""

    def once(pattern: str, replacement: str, text: str) -> str:
        changed, count = re.subn(pattern, replacement, text, flags=re.M)
        assert count == 1, f"deploy/nginx.conf: expected one {pattern!r}, found {count}"
        return changed

    for number, port in enumerate(replicas, start=1):
        conf = once(rf"\bgateway-{number}:8080\b", f"127.0.0.1:{port}", conf)
    conf = once(r"^(\s*)listen 80;", rf"\g<1>listen 127.0.0.1:{listen};", conf)
    conf = once(r"access_log /dev/stdout", f"access_log {prefix}/access.log", conf)
    # Distributions compile their own temp paths in (/var/lib/nginx/...): ours instead.
    temp_paths = "".join(
        f"    {kind}_temp_path {prefix}/{kind}_temp;\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return once(r"^http \{\n", f"http {{\n{temp_paths}", conf)


@dataclass
class Nginx:
    url: str
    prefix: Path

    def upstreams(self, path_prefix: str) -> list[str]:
        """The replica that answered each logged request whose path starts with `path_prefix`."""
        log = (self.prefix / "access.log").read_text()
        return re.findall(rf'"\w+ {re.escape(path_prefix)}\S* [^"]*" .*? upstream=(\S+)', log)


@contextlib.contextmanager
def nginx(replicas: list[int]) -> Iterator[Nginx]:
    """A private nginx master (and its workers) on a free loopback port; stopped by its PID."""
    assert NGINX is not None
    port = free_port()
    # Readable by nginx's workers, which run as nobody when the tests run as root.
    prefix = Path(tempfile.mkdtemp(prefix="mcpg-nginx-"))
    prefix.chmod(0o755)
    conf = prefix / "nginx.conf"
    conf.write_text(private_config(CONF.read_text(), port, replicas, prefix))
    args = [NGINX, "-p", str(prefix), "-c", str(conf), "-e", "stderr"]
    args += ["-g", f"daemon off; pid {prefix}/nginx.pid;"]
    with (prefix / "nginx.out").open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not _accepts(port):
            code = process.poll()
            assert code is None, f"nginx exited with {code}: {(prefix / 'nginx.out').read_text()}"
            assert time.monotonic() < deadline, "nginx did not listen"
            time.sleep(0.05)
        yield Nginx(f"http://127.0.0.1:{port}", prefix)
    finally:
        process.send_signal(signal.SIGTERM)  # the master stops its workers
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(prefix, ignore_errors=True)


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


# -- two replicas -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def replicas(database_url: str, tmp_path: Path, count: int = 2) -> AsyncIterator[list[int]]:
    """`count` single-process gateways on one database (same secrets), ready; their ports."""
    ports = [free_port() for _ in range(count)]
    env = environment(
        DATABASE_URL=database_url,
        GATEWAY_RUN_WORKERS="false",  # no background loops: not what is tested here
        GATEWAY_AUTH_RATE_LIMIT="10000/minute",
        # Not the 503s of a slow database (tested elsewhere): a loaded machine may be slow.
        GATEWAY_DB_ACQUIRE_TIMEOUT_SECONDS="30",
        GATEWAY_DATA_DIR=str(tmp_path / "data"),
        **SECRETS,
    )
    processes = []
    try:
        for port in ports:
            processes.append(_serve(port, env, tmp_path / f"gateway-{port}.log"))
        for process, port in zip(processes, ports, strict=True):
            await _ready(f"http://127.0.0.1:{port}", process)
        yield ports
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                await asyncio.to_thread(process.wait, STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _serve(port: int, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("wb") as log:
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)


async def _ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    async with aiohttp.ClientSession() as http:
        while True:
            assert process.poll() is None, f"the gateway at {url} exited"
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get(f"{url}/readyz") as response:
                    if response.status == 200:
                        return
            assert time.monotonic() < deadline, f"{url} not ready"
            await asyncio.sleep(0.1)


@dataclass
class Fronted:
    nginx: Nginx
    replicas: list[int]


@pytest.fixture
async def fronted(database_url: str, tmp_path: Path) -> AsyncIterator[Fronted]:
    async with replicas(database_url, tmp_path) as ports:
        with nginx(ports) as proxy:
            yield Fronted(proxy, ports)


# -- through nginx ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Owner:
    headers: dict[str, str]
    key: str


async def owner_with_server(http: aiohttp.ClientSession, upstream_url: str) -> tuple[Owner, str]:
    """Signup, an API key and a registered server, all through nginx."""
    signup = {
        "email": f"owner-{uuid.uuid4().hex[:8]}@example.com",
        "password": "password123",
        "name": "Owner",
    }
    async with http.post("/api/v1/auth/signup", json=signup) as response:
        tokens = await response.json()
        assert response.status == 201, tokens
    headers = {"Authorization": f"Bearer {tokens['access_token']}"}
    workspace = tokens["workspace"]["id"]
    async with http.post(
        f"/api/v1/workspaces/{workspace}/api-keys", json={"name": "k"}, headers=headers
    ) as response:
        key = await response.json()
        assert response.status == 201, key
    server = {"name": f"upstream-{uuid.uuid4().hex[:6]}", "url": upstream_url}
    async with http.post("/api/v1/servers", json=server, headers=headers) as response:
        created = await response.json()
        assert response.status == 201, created
    return Owner(headers, key["key"]), created["id"]


async def logged(database_url: str, server_id: str, count: int) -> list[Any]:
    """The server's tool_calls rows, once there are `count` (the log is written in batches)."""
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + READ_SECONDS
        while True:
            rows = await conn.fetch(
                "SELECT tool_name, status FROM tool_calls WHERE server_id = $1 "
                "ORDER BY created_at, id",
                uuid.UUID(server_id),
            )
            if len(rows) >= count or time.monotonic() > deadline:
                assert len(rows) == count, rows
                return rows
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def test_an_sdk_session_through_nginx_spans_both_replicas(
    fronted: Fronted, database_url: str, sdk_stateful: str
) -> None:
    async with aiohttp.ClientSession(fronted.nginx.url) as http:
        owner, server_id = await owner_with_server(http, sdk_stateful)
    url = f"{fronted.nginx.url}/api/v1/proxy/{server_id}/mcp"
    # One MCP session (Mcp-Session-Id, SSE replies): each of its requests may reach either
    # replica, and the session holds.
    async with sdk_client(url, owner.key, "legacy", **{"X-Caller-Agent": "via-nginx"}) as client:
        tools = await client.list_tools()
        sums = [await client.call_tool("add", {"a": i, "b": 1}) for i in range(4)]
    assert {"add", "echo"} <= {tool.name for tool in tools.tools}
    assert [s.structured_content for s in sums] == [{"result": i + 1} for i in range(4)]
    # nginx spread the session's requests over both replicas (round robin, no stickiness).
    answered_by = fronted.nginx.upstreams(f"/api/v1/proxy/{server_id}/")
    assert set(answered_by) == {f"127.0.0.1:{port}" for port in fronted.replicas}, answered_by
    rows = await logged(database_url, server_id, 4)
    assert [(r["tool_name"], r["status"]) for r in rows] == [("add", "success")] * 4


async def test_sse_passes_through_nginx_event_by_event(fronted: Fronted, database_url: str) -> None:
    first_seen = asyncio.Event()
    second_sent = False

    async def two_events(request: web.Request) -> web.StreamResponse:
        nonlocal second_sent
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'event: message\ndata: {"jsonrpc":"2.0","method":"progress"}\n\n')
        # Event 2 only once the client has event 1: behind a buffering proxy it never would.
        await asyncio.wait_for(first_seen.wait(), timeout=READ_SECONDS)
        second_sent = True
        await response.write(b'event: message\ndata: {"jsonrpc":"2.0","id":1,"result":{}}\n\n')
        await response.write_eof()
        return response

    upstream = web.Application()
    upstream.router.add_post("/mcp", two_events)
    async with (
        serve_loopback(upstream) as upstream_url,
        aiohttp.ClientSession(fronted.nginx.url) as http,
    ):
        owner, server_id = await owner_with_server(http, f"{upstream_url}/mcp")
        message = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "stream", "arguments": {}},
        }
        headers = {"X-API-Key": owner.key, "Accept": ACCEPT}
        async with http.post(
            f"/api/v1/proxy/{server_id}/mcp", json=message, headers=headers
        ) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/event-stream"
            received = b""
            while b"progress" not in received:
                received += await asyncio.wait_for(response.content.readany(), timeout=READ_SECONDS)
            assert not second_sent
            first_seen.set()
            received += await asyncio.wait_for(response.content.read(), timeout=READ_SECONDS)
    assert second_sent
    assert received.count(b"event: message") == 2
    [row] = await logged(database_url, server_id, 1)
    assert (row["tool_name"], row["status"]) == ("stream", "success")
