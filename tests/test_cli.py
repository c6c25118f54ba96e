"""The mcp-gateway command as a user runs it (a subprocess): serve, migrate, and every way it
can fail, each in one line with its exit status (2 for a usage error, 1 for the world)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from importlib.metadata import version
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import pytest

from gateway.cli import main
from gateway.config import ENV_VARIABLES
from tests.helpers.processes import SECRETS, environment
from tests.helpers.upstreams import free_port

# A hang guard, not a timing: a loaded machine may take long to start Python and the app.
STARTUP_SECONDS = 60.0


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)


async def test_migrate_creates_the_schema_and_is_idempotent(empty_database: str) -> None:
    command = shutil.which("mcp-gateway")
    assert command is not None, "the console script is not installed (pip install -e .)"
    first = await asyncio.to_thread(
        run, [command, "migrate"], environment(DATABASE_URL=empty_database, **SECRETS)
    )
    assert first.returncode == 0, first.stderr
    assert "schema is at version" in first.stdout
    # Again, through python -m and without secrets (the schema needs none): nothing to do.
    second = await asyncio.to_thread(
        run, [sys.executable, "-m", "gateway", "migrate"], environment(DATABASE_URL=empty_database)
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    conn = await asyncpg.connect(empty_database)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_version") >= 1
        assert await conn.fetchval("SELECT to_regclass('users') IS NOT NULL")
    finally:
        await conn.close()


# -- serving ---------------------------------------------------------------------------------


class Served:
    """`python -m gateway serve` on a free port, its output read line by line as it comes."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int) -> None:
        self.proc, self.port, self.lines = proc, port, list[str]()

    async def line_with(self, text: str) -> str:
        """The next line holding `text` (every line read is kept in self.lines)."""
        assert self.proc.stdout is not None
        while True:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), STARTUP_SECONDS)
            assert raw, f"the gateway exited before saying {text!r}:\n{self.output}"
            self.lines.append(raw.decode().rstrip("\n"))
            if text in self.lines[-1]:
                return self.lines[-1]

    async def stop(self) -> int:
        """SIGTERM, then the rest of the output; the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(self.proc.communicate(), STARTUP_SECONDS)
        self.lines += rest.decode().splitlines()
        assert self.proc.returncode is not None
        return self.proc.returncode

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


@contextlib.asynccontextmanager
async def serving(database_url: str, *args: str, **env: str) -> AsyncIterator[Served]:
    port = free_port()
    environ = environment(DATABASE_URL=database_url, GATEWAY_RUN_WORKERS="false", **SECRETS)
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "gateway", "serve", "--port", str(port), *args],
        env={**environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        yield Served(proc, port)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


async def test_serve_says_listening_once_it_accepts_and_stops_on_sigterm(
    database_url: str,
) -> None:
    async with serving(database_url) as served:
        listening = await served.line_with("listening on")
        # Said once bound and listening: connecting now must work, at the port it names.
        assert await accepts(served.port), listening
        assert f"listening on http://127.0.0.1:{served.port} " in listening
        assert f"mcp-gateway {version('mcp-gateway')} listening" in listening
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{served.port}/api/v1/openapi.json") as response,
        ):
            assert (await response.json())["openapi"] == "3.1.0"
        assert await served.stop() == 0, served.output
    stopping = next(line for line in served.lines if "received SIGTERM" in line)
    assert re.search(
        r"stopping; draining \d+ open connections \(\d+ proxied requests in flight\) "
        r"and \d+ queued tool calls",
        stopping,
    ), stopping
    assert served.lines[-1].endswith("mcp-gateway stopped"), served.output
    assert "gateway.access" not in served.output  # off unless asked for
    assert "Traceback" not in served.output


async def test_the_access_log_has_a_line_per_request_and_no_credentials(
    database_url: str,
) -> None:
    api_key, token, cookie = "mgw_KEYVALUE123", "TOKENVALUE456", "COOKIEVALUE789"
    async with serving(database_url, GATEWAY_ACCESS_LOG="true") as served:
        await served.line_with("listening on")
        url = f"http://127.0.0.1:{served.port}"
        async with aiohttp.ClientSession(headers={"Cookie": f"session={cookie}"}) as http:
            secret_headers = {"X-API-Key": api_key, "Authorization": f"Bearer {api_key}"}
            async with http.get(f"{url}/healthz?token={token}", headers=secret_headers) as r:
                assert r.status == 200
            # An invitation link carries its token in the path.
            async with http.get(f"{url}/invite/{token}") as r:
                invite_status = r.status
            async with http.post(f"{url}/api/v1/proxy/{uuid.uuid4()}/mcp", json={}) as r:
                proxy_status = r.status
        assert await served.stop() == 0, served.output
    access = [line for line in served.lines if "gateway.access" in line]
    assert len(access) == 3, served.output
    assert re.search(r'127\.0\.0\.1 "GET /healthz\?token=\.\.\." 200 \d+ B [\d.]+ ms$', access[0])
    assert f'"GET /invite/{{token}}" {invite_status} ' in access[1]
    assert f" {proxy_status} " in access[2] and '"POST /api/v1/proxy/' in access[2]
    for secret in (api_key, token, cookie):
        assert secret not in served.output


# -- failures: one line, no traceback ----------------------------------------------------------


def one_line_failure(args: list[str], env: dict[str, str], status: int) -> str:
    """Run `python -m gateway ARGS`; it must exit with `status` and say why in exactly one
    line on stderr (no traceback), which is returned."""
    done = run([sys.executable, "-m", "gateway", *args], environment(**env))
    assert done.returncode == status, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def closed_port_url() -> str:
    return f"postgresql://gw:password@127.0.0.1:{free_port()}/gateway"


UNRESOLVABLE_URL = "postgresql://gw:password@db.gateway.invalid/gateway"


@pytest.mark.parametrize(
    "args",
    [
        ["serve"],
        ["serve", "--workers", "2"],
        ["migrate"],
        ["rotate-secrets"],
        ["rollups", "rebuild"],
    ],
)
def test_a_database_nobody_listens_at_is_one_line(args: list[str]) -> None:
    url = closed_port_url()
    address = url.rpartition("@")[2].partition("/")[0]
    if args[0] == "serve":
        args = [*args, "--port", str(free_port())]
    line = one_line_failure(args, {"DATABASE_URL": url, **SECRETS}, 1)
    assert line == (
        f"mcp-gateway: cannot connect to the database at {address} (DATABASE_URL): "
        "connection refused (is PostgreSQL running there?)"
    )
    assert "password" not in line


@pytest.mark.parametrize("args", [["serve"], ["migrate"]])
def test_a_database_host_that_does_not_resolve_is_one_line(args: list[str]) -> None:
    if args[0] == "serve":
        args = [*args, "--port", str(free_port())]
    line = one_line_failure(args, {"DATABASE_URL": UNRESOLVABLE_URL, **SECRETS}, 1)
    assert line == (
        "mcp-gateway: cannot connect to the database at db.gateway.invalid:5432 "
        "(DATABASE_URL): the host name does not resolve"
    )


def test_migrate_with_a_malformed_url_is_one_line() -> None:
    line = one_line_failure(["migrate"], {"DATABASE_URL": "postgresql://gw@db:port/x"}, 1)
    assert line.startswith(
        "mcp-gateway: cannot connect to the database at db:port (DATABASE_URL): "
        "the URL cannot be read"
    )


async def test_a_database_that_refuses_us_is_one_line(database_url: str) -> None:
    # The same server, another database name (the embedded one's URL names a socket directory
    # in its query, which holds slashes too).
    missing = urlunsplit(urlsplit(database_url)._replace(path="/no_such_database"))
    line = await asyncio.to_thread(one_line_failure, ["migrate"], {"DATABASE_URL": missing}, 1)
    assert line.endswith('(DATABASE_URL): database "no_such_database" does not exist'), line


def test_a_socket_directory_that_is_not_there_is_named() -> None:
    dsn = "postgresql://postgres@/gw?host=/nonexistent/socket-dir"
    line = one_line_failure(["migrate"], {"DATABASE_URL": dsn}, 1)
    assert line.startswith(
        "mcp-gateway: cannot connect to the database at /nonexistent/socket-dir (DATABASE_URL): "
    ), line


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_is_one_line(workers: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # The port is checked first: the database is never reached.
        env = {"DATABASE_URL": closed_port_url(), **SECRETS}
        line = one_line_failure(["serve", "--port", str(port), "--workers", workers], env, 1)
    assert line == (
        f"mcp-gateway: cannot listen on 127.0.0.1:{port}: the address is already in use "
        "(another process listens there)"
    )


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--port", "99999"], {}, "argument --port: expected a port from 1 to 65535, got 99999"),
        (["--port", "-5"], {}, "argument --port: expected a port from 1 to 65535, got -5"),
        (["--port", "0"], {}, "argument --port: expected a port from 1 to 65535, got 0"),
        (["--port", "abc"], {}, "argument --port: expected a port from 1 to 65535, got 'abc'"),
        (
            ["--workers", "many"],
            {},
            "argument --workers: expected a number of processes or auto, got 'many'",
        ),
        (["--workers", "0"], {}, "argument --workers: expected a number of processes"),
    ],
)
def test_bad_flags_are_one_usage_line(args: list[str], env: dict[str, str], message: str) -> None:
    line = one_line_failure(["serve", *args], env, 2)
    assert line.startswith(f"mcp-gateway serve: error: {message}"), line
    assert "_" not in line.partition("error:")[2], line  # no internal name


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("GATEWAY_PORT", "99999", "expected a port from 1 to 65535, got 99999"),
        (
            "GATEWAY_PORT",
            "0",
            "expected a port from 1 to 65535, got 0 (any free port is not offered)",
        ),
        ("GATEWAY_PORT", "-5", "expected a port from 1 to 65535, got -5"),
        ("GATEWAY_WORKERS", "many", "expected a number of processes or auto, got 'many'"),
    ],
)
def test_bad_settings_are_one_line(name: str, value: str, message: str) -> None:
    line = one_line_failure(["serve"], {name: value}, 2)
    assert line == f"mcp-gateway: configuration error: {name}: {message}"


def test_version_comes_from_the_package_metadata() -> None:
    done = run([sys.executable, "-m", "gateway", "--version"], environment())
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"mcp-gateway {version('mcp-gateway')}\n"


@pytest.mark.parametrize(
    ("command", "env", "message"),
    [
        ("migrate", {"GATEWAY_PORT": "eighty"}, "GATEWAY_PORT: expected a port from 1 to 65535"),
        ("serve", {"DATABASE_URL": "mysql://db/x"}, "DATABASE_URL: expected a URL"),
        (
            "serve",
            {"DATABASE_URL": "postgresql://127.0.0.1:1/none"},
            "GATEWAY_JWT_SECRET: must be set when DATABASE_URL is set",
        ),
    ],
)
def test_configuration_errors_stop_with_a_message_naming_the_variable(
    command: str,
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ENV_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        main([command])
    assert exit_.value.code == 2
    assert f"mcp-gateway: configuration error: {message}" in capsys.readouterr().err
