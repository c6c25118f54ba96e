"""Shared pieces of the benchmarks: a private PostgreSQL, a gateway process, CPU pinning, wrk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from cryptography.fernet import Fernet

ROOT = Path(__file__).resolve().parent.parent
GATEWAY_CPU = "0"
OTHERS_CPU = "1"  # upstream, load generator, PostgreSQL


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


def pinned(cpu: str, args: list[str]) -> list[str]:
    return ["taskset", "-c", cpu, *args] if shutil.which("taskset") else args


@contextlib.contextmanager
def process(
    args: list[str], port: int, env: dict[str, str] | None = None, startup_seconds: float = 60
) -> Iterator[int]:
    """Run a server process until the block ends; stopped by its own PID (SIGTERM, then kill)."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=ROOT
    )
    try:
        wait_for_port(port, proc, startup_seconds)
        yield proc.pid
    except BaseException:
        log.seek(0)
        sys.stderr.write(log.read().decode(errors="replace")[-3000:])
        raise
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextlib.contextmanager
def mcp_upstream() -> Iterator[str]:
    """bench/proxy.py's cheap MCP upstream (stateless JSON), pinned to the load generator's
    CPU; yields its URL."""
    port = free_port()
    args = [sys.executable, str(ROOT / "bench" / "proxy.py"), "--role", "upstream"]
    with process(pinned(OTHERS_CPU, [*args, "--port", str(port)]), port):
        yield f"http://127.0.0.1:{port}/mcp"


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A private PostgreSQL (pgserver) pinned to the CPU of the load generator."""
    import pgserver

    with tempfile.TemporaryDirectory(prefix="mcpg-bench-") as tmp:
        Path(tmp).chmod(0o755)  # pgserver runs postgres as its own user when we are root
        server = pgserver.get_server(Path(tmp) / "pg", cleanup_mode="delete")
        try:
            pid = server.get_pid()
            if pid and shutil.which("taskset"):
                subprocess.run(
                    ["taskset", "-a", "-c", "-p", OTHERS_CPU, str(pid)],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
            yield server.get_uri()
        finally:
            server.cleanup()


@dataclass
class Gateway:
    url: str
    dsn: str
    key: str
    workspace_id: uuid.UUID
    fernet_key: str
    pid: int
    # The signed-up owner of workspace_id (password BENCH_PASSWORD), for the dashboard.
    email: str

    async def add_server(self, upstream_url: str) -> uuid.UUID:
        conn = await asyncpg.connect(self.dsn)
        try:
            server_id: uuid.UUID = await conn.fetchval(
                "INSERT INTO servers (workspace_id, name, url) VALUES ($1, $2, $3) RETURNING id",
                self.workspace_id,
                f"bench-{uuid.uuid4().hex[:8]}",
                upstream_url,
            )
        finally:
            await conn.close()
        return server_id

    async def govern(self, server_id: uuid.UUID) -> None:
        """Give the bench key and server rules the bench's calls pass (governed access), so
        their cost is measured: allowed tools, a rate limit no run reaches, a disabled tool."""
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(
                "UPDATE api_keys SET allowed_tools = '{echo,add}', "
                "rate_limit = '999999999/minute' WHERE workspace_id = $1",
                self.workspace_id,
            )
            await conn.execute(
                "UPDATE servers SET disabled_tools = '{delete_*}', "
                "rate_limit = '999999999/minute' WHERE id = $1",
                server_id,
            )
        finally:
            await conn.close()

    async def count_calls(self) -> int:
        conn = await asyncpg.connect(self.dsn)
        try:
            count: int = await conn.fetchval("SELECT count(*) FROM tool_calls")
            return count
        finally:
            await conn.close()


async def logged(dsn: str, server_id: uuid.UUID) -> int:
    """The tool calls of one server in the log."""
    conn = await asyncpg.connect(dsn)
    try:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM tool_calls WHERE server_id = $1", server_id
        )
        return count
    finally:
        await conn.close()


@contextlib.contextmanager
def gateway(
    dsn: str,
    settings: dict[str, str] | None = None,
    wrapper: list[str] | None = None,
    startup_seconds: float = 60,
) -> Iterator[Gateway]:
    """`mcp-gateway serve` (one process, uvloop) pinned to its own CPU, with a user and API key.
    `settings`: more environment variables for it (e.g. GATEWAY_ANALYTICS_CACHE_SECONDS);
    `wrapper`: a command it runs under (e.g. valgrind)."""
    port = free_port()
    fernet_key = Fernet.generate_key().decode()
    env = {
        "DATABASE_URL": dsn,
        "GATEWAY_JWT_SECRET": "bench-" + "x" * 40,
        "GATEWAY_SECRET_KEYS": fernet_key,
        "GATEWAY_AUTH_RATE_LIMIT": "100000/minute",
        **(settings or {}),
    }
    serve = [sys.executable, "-m", "gateway", "serve", "--port", str(port)]
    args = pinned(GATEWAY_CPU, [*(wrapper or []), *serve])
    with process(args, port, env, startup_seconds) as pid:
        url = f"http://127.0.0.1:{port}"
        key, workspace_id, email = asyncio.run(_account(url))
        yield Gateway(url, dsn, key, workspace_id, fernet_key, pid, email)


BENCH_PASSWORD = "benchmark1"


async def _account(url: str) -> tuple[str, uuid.UUID, str]:
    import aiohttp

    async with aiohttp.ClientSession(url) as http:
        signup = {
            "email": f"bench-{uuid.uuid4().hex[:6]}@example.com",
            "password": BENCH_PASSWORD,
            "name": "Bench",
        }
        async with http.post("/api/v1/auth/signup", json=signup) as response:
            tokens = await response.json()
            assert response.status == 201, tokens
        workspace_id = tokens["workspace"]["id"]
        headers = {"Authorization": f"Bearer {tokens['access_token']}"}
        async with http.post(
            f"/api/v1/workspaces/{workspace_id}/api-keys", json={"name": "bench"}, headers=headers
        ) as response:
            created = await response.json()
            assert response.status == 201, created
        return created["key"], uuid.UUID(workspace_id), signup["email"]


# -- wrk ---------------------------------------------------------------------------------------

# The headers of an MCP client's tools/call (the SDK clients send a User-Agent and, after the
# handshake, the protocol version), plus the caller's API key and agent name.
_WRK_SCRIPT = """
local counter = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["User-Agent"] = "mcp-bench/1.0"
wrk.headers["MCP-Protocol-Version"] = "2025-06-18"
local key = os.getenv("BENCH_API_KEY")
if key and key ~= "" then wrk.headers["X-API-Key"] = key end
wrk.headers["X-Caller-Agent"] = "wrk"
-- More headers, one "Name: value" per line (a toolset's session, the 2026-07-28 headers).
for name, value in string.gmatch(os.getenv("BENCH_HEADERS") or "", "([^:\\n]+): ([^\\n]*)") do
  wrk.headers[name] = value
end
local tool = os.getenv("BENCH_TOOL") or "echo"
request = function()
  counter = counter + 1
  local body = '{"jsonrpc":"2.0","id":' .. counter ..
    ',"method":"tools/call","params":{"name":"' .. tool .. '","arguments":{"text":"hello"}}}'
  return wrk.format(nil, nil, nil, body)
end
"""


@dataclass
class WrkResult:
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    if match is None:
        print(f"wrk: cannot read a latency from {text!r}", file=sys.stderr)
        return float("nan")
    value, unit = match.groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1e3, "m": 6e4, "h": 3.6e6}[unit]


def wrk(
    url: str,
    connections: int,
    seconds: float,
    api_key: str = "",
    *,
    tool: str = "echo",
    headers: dict[str, str] | None = None,
) -> WrkResult:
    """wrk posting tools/call of `tool` with distinct ids (and `headers` besides the usual)."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install -y wrk")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_WRK_SCRIPT)
    try:
        args = pinned(
            OTHERS_CPU,
            [
                "wrk",
                "-t1",
                f"-c{connections}",
                f"-d{int(seconds)}s",
                "--latency",
                "-s",
                script.name,
                url,
            ],
        )
        out = subprocess.run(
            args,
            capture_output=True,
            text=True,
            check=True,
            timeout=seconds + 30,
            env={
                **os.environ,
                "BENCH_API_KEY": api_key,
                "BENCH_TOOL": tool,
                "BENCH_HEADERS": "\n".join(f"{k}: {v}" for k, v in (headers or {}).items()),
            },
        ).stdout
    finally:
        os.unlink(script.name)
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"^\s*50%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"^\s*99%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out
    )
    errors = int(bad.group(1)) if bad else 0
    if socket_errors:
        errors += sum(int(g) for g in socket_errors.groups())
    return WrkResult(requests, rps, p50, p99, errors)


def median_result(results: list[WrkResult]) -> dict[str, Any]:
    return {
        "rps": statistics.median(r.rps for r in results),
        "p50_ms": statistics.median(r.p50_ms for r in results),
        "p99_ms": statistics.median(r.p99_ms for r in results),
        "requests": sum(r.requests for r in results),
        "errors": sum(r.errors for r in results),
    }
