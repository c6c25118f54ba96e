"""The mcp-gateway command: migrate and serve against a real database, and its config errors."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import time

import aiohttp
import asyncpg
import pytest

from gateway.cli import main
from gateway.config import ENV_VARIABLES
from tests.helpers.processes import SECRETS, environment
from tests.helpers.upstreams import free_port


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


async def test_serve_answers_http_and_stops_on_sigterm(database_url: str) -> None:
    port = free_port()
    env = environment(DATABASE_URL=database_url, GATEWAY_RUN_WORKERS="false", **SECRETS)
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        document = await _get_json(f"http://127.0.0.1:{port}/api/v1/openapi.json", proc)
        assert document["openapi"] == "3.1.0"
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 0, output.decode()


async def _get_json(url: str, proc: asyncio.subprocess.Process) -> dict[str, object]:
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while True:
            assert proc.returncode is None, "the server exited"
            try:
                async with session.get(url) as response:
                    assert response.status == 200
                    document: dict[str, object] = await response.json()
                    return document
            except aiohttp.ClientConnectionError:
                assert time.monotonic() < deadline, "the server never answered"
                await asyncio.sleep(0.1)


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
