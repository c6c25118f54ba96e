"""`serve --workers 2` as a real process tree in tests: start it, know its workers, keep a
connection pinned to each, stop it by PID.

A test acts on one known worker through one keep-alive connection (a session limited to one
connection, which must never open a second): /healthz on it says which worker it is, and every
later request on it reaches the same process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers.processes import SECRETS, environment
from tests.helpers.upstreams import free_port

WORKERS = 2
# Probes only when a server is new or the test makes it due; rules are due every second.
PROBE_INTERVAL = 3600.0
ALERT_INTERVAL = 1.0
# Hang guards, not timings: a loaded 2-core machine may take many seconds to start Python.
STARTUP_SECONDS = 90.0
STOP_SECONDS = 45.0
# Fresh connections tried before concluding the kernel does not spread them: with two
# workers, missing one by chance has probability 2**-63.
SPREAD_ATTEMPTS = 64
_STARTED = re.compile(r"worker (\d+) started \(pid (\d+)\)")


# -- the process tree ------------------------------------------------------------------------


@dataclass
class Supervised:
    """The parent process, its log, and the base URL its workers serve."""

    process: subprocess.Popen[bytes]
    log_path: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def started(self) -> list[tuple[int, int]]:
        """(worker id, pid) of every worker the parent started, in order."""
        return [(int(w), int(p)) for w, p in _STARTED.findall(self.log())]

    def worker_pids(self) -> dict[int, int]:
        """The latest pid of each worker id."""
        return dict(self.started())

    def check_running(self) -> None:
        code = self.process.poll()
        assert code is None, f"the gateway exited with {code}:\n{self.log()[-4000:]}"


def listeners(port: int) -> int:
    """Sockets listening on 127.0.0.1:port (one per worker with SO_REUSEPORT). A worker binds
    only once its app has started (schema, pool, cache listener), so this counts ready workers."""
    local = f"0100007F:{port:04X}"
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[3] == "0A":  # 0A: LISTEN
            count += 1
    return count


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def ours(pid: int) -> bool:
    """A multiprocessing child still running under this pid (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    return b"multiprocessing" in cmdline and alive(pid)


async def until(
    condition: Callable[[], bool], what: str, within: float, gateway: Supervised
) -> None:
    """Poll `condition()` until it holds; fail naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        gateway.check_running()
        assert time.monotonic() < deadline, f"{what}: not within {within:g} s\n{gateway.log()}"
        await asyncio.sleep(0.05)


async def until_async(
    condition: Callable[[], Awaitable[bool]], what: str, gateway: Supervised
) -> None:
    """`until` for a condition that must ask PostgreSQL."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while not await condition():
        gateway.check_running()
        assert time.monotonic() < deadline, f"{what}: not within {STARTUP_SECONDS:g} s"
        await asyncio.sleep(0.05)


async def all_listening(gateway: Supervised) -> None:
    await until(
        lambda: listeners(gateway.port) == WORKERS,
        f"{WORKERS} workers listening",
        STARTUP_SECONDS,
        gateway,
    )


def start(args: list[str], env: dict[str, str], log_path: Path, port: int) -> Supervised:
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    return Supervised(process, log_path, port)


def stop(supervised: Supervised) -> None:
    process = supervised.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for _, pid in supervised.started():
        if ours(pid):
            os.kill(pid, signal.SIGKILL)


# -- talking to one worker -------------------------------------------------------------------


@dataclass
class Pinned:
    """One keep-alive connection to one worker, and every request sent on it."""

    session: aiohttp.ClientSession
    worker: int
    opened: list[object] = field(default_factory=list)

    async def request(
        self, method: str, path: str, *, auth: str | dict[str, str] | None = None, **kw: Any
    ) -> tuple[int, Any]:
        headers = dict(kw.pop("headers", {}))
        if isinstance(auth, str):
            headers["X-API-Key"] = auth
        elif auth is not None:
            headers.update(auth)
        async with self.session.request(method, path, headers=headers, **kw) as response:
            body = await response.json() if response.content_type == "application/json" else None
            status = response.status
        # Still the one connection this session opened, so still the same worker.
        assert len(self.opened) == 1, f"a new connection was opened: worker {self.worker}?"
        return status, body


async def connect(url: str) -> Pinned:
    """A session with one connection, pinned to whichever worker accepted it."""
    opened: list[object] = []

    async def count(_session: object, _context: object, params: object) -> None:
        opened.append(params)

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(count)
    session = aiohttp.ClientSession(
        url,
        connector=aiohttp.TCPConnector(limit=1, keepalive_timeout=120),
        trace_configs=[trace],
        timeout=aiohttp.ClientTimeout(total=30),
    )
    try:
        async with session.get("/healthz") as response:
            assert response.status == 200
            worker: int = (await response.json())["worker"]
    except BaseException:
        await session.close()
        raise
    return Pinned(session, worker, opened)


async def fresh_worker_ids(url: str, attempts: int = SPREAD_ATTEMPTS) -> set[int]:
    """The worker ids that answer /healthz on new connections, until every one has (at most
    `attempts` connections)."""
    seen: set[int] = set()
    connector = aiohttp.TCPConnector(force_close=True)  # a new connection per request
    async with aiohttp.ClientSession(url, connector=connector) as http:
        for _ in range(attempts):
            async with http.get("/healthz") as response:
                assert response.status == 200
                seen.add((await response.json())["worker"])
            if len(seen) == WORKERS:
                break
    return seen


@contextlib.asynccontextmanager
async def one_per_worker(url: str) -> AsyncIterator[dict[int, Pinned]]:
    """A pinned connection to each worker (trying at most SPREAD_ATTEMPTS connections)."""
    pinned: dict[int, Pinned] = {}
    try:
        for _ in range(SPREAD_ATTEMPTS):
            candidate = await connect(url)
            if candidate.worker in pinned:
                await candidate.session.close()
            else:
                pinned[candidate.worker] = candidate
            if len(pinned) == WORKERS:
                break
        assert sorted(pinned) == list(range(1, WORKERS + 1)), sorted(pinned)
        yield pinned
    finally:
        for each in pinned.values():
            await each.session.close()


@contextlib.asynccontextmanager
async def supervised_gateway(database_url: str, tmp_path: Path) -> AsyncIterator[Supervised]:
    """`python -m gateway serve --workers 2` on a free port, ready; stopped by PID at the end
    (the parent with SIGTERM, then anything of its tree still running with SIGKILL)."""
    port = free_port()
    env = environment(
        DATABASE_URL=database_url,
        GATEWAY_DATA_DIR=str(tmp_path / "data"),
        GATEWAY_PROBE_INTERVAL_SECONDS=str(PROBE_INTERVAL),
        GATEWAY_ALERT_EVAL_INTERVAL_SECONDS=str(ALERT_INTERVAL),
        GATEWAY_AUTH_RATE_LIMIT="10000/minute",
        # Not the 503s of a slow database (tested elsewhere): a loaded machine may be slow.
        GATEWAY_DB_ACQUIRE_TIMEOUT_SECONDS="30",
        **SECRETS,
    )
    log_path = tmp_path / "gateway.log"
    args = [sys.executable, "-m", "gateway", "serve", "--workers", str(WORKERS)]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    supervised = start(args, env, log_path, port)
    try:
        await all_listening(supervised)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{supervised.url}/readyz") as response,
        ):
            assert response.status == 200, await response.text()
        yield supervised
    finally:
        await asyncio.to_thread(stop, supervised)
