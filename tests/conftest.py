"""Fixtures: a real PostgreSQL, a fresh database per test, the app, and an API client.

PostgreSQL is TEST_DATABASE_URL when set (a role allowed to CREATE DATABASE), else an embedded
server from pgserver under pytest's temp dir. The schema is applied once to a template
database; each test gets its own copy (CREATE DATABASE ... TEMPLATE), so tests are isolated.
Redis, for the tests that need one, is TEST_REDIS_URL when set, else a private redis-server
when one is on PATH; without either those tests skip. Under pytest-xdist every worker has its
own session, so its own servers and template database.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from argon2 import PasswordHasher
from cryptography.fernet import Fernet

from gateway.app import create_app
from gateway.config import Settings
from gateway.db.schema import apply_schema
from gateway.security import passwords
from tests.helpers.api import Api, AppFactory
from tests.helpers.contract import ContractChecker
from tests.helpers.postgres import scratch_database, with_database
from tests.helpers.upstreams import free_port, running, sdk_server

TEST_FERNET_KEY = Fernet.generate_key().decode()


def run_sync(coro: Awaitable[Any]) -> Any:
    """Run a coroutine on its own loop in a thread, away from the tests' event loops."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def pg_admin_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        yield url
        return
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="delete")
    yield server.get_uri()
    server.cleanup()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """TEST_REDIS_URL, else a redis-server of this session's own on a free loopback port (never
    the machine's Redis, whose keys are not ours to touch); the test skips without either."""
    url = os.environ.get("TEST_REDIS_URL")
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("needs Redis: install redis-server (on PATH) or set TEST_REDIS_URL")
    with private_redis(binary, tmp_path_factory.mktemp("redis")) as url:
        yield url


@contextlib.contextmanager
def private_redis(binary: str, directory: Path) -> Iterator[str]:
    """redis-server on 127.0.0.1 (a free port), storing nothing on disk, stopped by PID."""
    port = free_port()
    args = [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory)]
    args += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
    with running(args, lambda proc, log: _wait_for_redis(proc, port, log)):
        yield f"redis://127.0.0.1:{port}/0"


def _wait_for_redis(proc: subprocess.Popen[bytes], port: int, log: Any) -> None:
    # PONG, not an open port: the port could be another process's that took it meanwhile.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            output = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"redis-server exited with {proc.returncode}:\n{output}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as s:
            s.sendall(b"PING\r\n")
            if s.recv(64).startswith(b"+PONG"):
                return
        time.sleep(0.05)
    raise RuntimeError(f"redis-server did not answer on port {port} within 30 s")


@pytest.fixture(scope="session")
def template_db(pg_admin_dsn: str) -> Iterator[str]:
    name = f"gw_tpl_{secrets.token_hex(4)}"

    async def create() -> None:
        admin = await asyncpg.connect(pg_admin_dsn)
        await admin.execute(f"CREATE DATABASE {name}")
        await admin.close()
        conn = await asyncpg.connect(with_database(pg_admin_dsn, name))
        await apply_schema(conn)
        await conn.close()

    async def drop() -> None:
        admin = await asyncpg.connect(pg_admin_dsn)
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()

    run_sync(create())
    yield name
    run_sync(drop())


@pytest.fixture
async def database_url(pg_admin_dsn: str, template_db: str) -> AsyncIterator[str]:
    """A fresh database with the schema, dropped after the test."""
    async with scratch_database(pg_admin_dsn, "gw_t", template_db) as url:
        yield url


@pytest.fixture
async def empty_database(pg_admin_dsn: str) -> AsyncIterator[str]:
    """A database without the schema."""
    async with scratch_database(pg_admin_dsn, "gw_empty") as url:
        yield url


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=database_url,
        data_dir=tmp_path,
        public_url="http://gateway.test",
        jwt_secret="test-secret-" + "x" * 40,
        secret_keys=(TEST_FERNET_KEY,),
        auth_rate_limit="10000/minute",
        run_workers=False,
    )


@pytest.fixture
async def make_api(
    # settings (and so the database) first: fixtures are torn down in reverse, so the apps
    # stop (draining their call log) before their database is dropped.
    settings: Settings,
    aiohttp_client: Callable[..., Awaitable[TestClient[web.Request, web.Application]]],
) -> AsyncIterator[AppFactory]:
    """Start an app (optionally with changed settings) and return an Api client for it.

    Every response is checked against the OpenAPI document; violations fail the test.
    """
    checkers: list[ContractChecker] = []

    async def make(**changes: Any) -> Api:
        app = create_app(settings.replace(**changes) if changes else settings)
        checker = ContractChecker(app)
        checkers.append(checker)
        app.middlewares.insert(0, checker.middleware)  # outermost: sees rendered errors
        client = await aiohttp_client(app)
        return Api(client)

    yield make
    for checker in checkers:
        checker.assert_clean()


@pytest.fixture
async def api(make_api: AppFactory) -> Api:
    return await make_api()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A direct connection to the test's database, for arranging and checking rows."""
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


@pytest.fixture(scope="session")
def sdk_sse_url() -> Iterator[str]:
    """Stateful SDK server answering with SSE, with priming events and two tools per page."""
    with sdk_server(priming=True, page_size=2) as url:
        yield url


@pytest.fixture(scope="session")
def sdk_json_url() -> Iterator[str]:
    """Stateless SDK server answering with plain JSON."""
    with sdk_server(stateless=True, json_response=True) as url:
        yield url


@pytest.fixture(scope="session")
def sdk_stateful() -> Iterator[str]:
    """The SDK server in its default mode: sessions, SSE replies to handshake-era clients."""
    with sdk_server() as url:
        yield url


@pytest.fixture(scope="session")
def sdk_stateless() -> Iterator[str]:
    """Stateless SDK server answering with plain JSON."""
    with sdk_server(stateless=True, json_response=True) as url:
        yield url


@pytest.fixture(scope="session")
def sdk_interactive() -> Iterator[str]:
    """The SDK server in its default mode, with a tool that elicits and one that becomes a
    task (the tasks extension): SSE replies to handshake-era clients, and to 2026-07-28 ones
    when a tool sends a notification first."""
    with sdk_server(interactive=True) as url:
        yield url


@pytest.fixture(scope="session")
def sdk_interactive_json() -> Iterator[str]:
    """The same tools on a stateless SDK server answering with plain JSON."""
    with sdk_server(stateless=True, json_response=True, interactive=True) as url:
        yield url


@pytest.fixture(
    params=[(u, m) for u in ("sdk_stateful", "sdk_stateless") for m in ("legacy", "auto")],
    ids=lambda param: "-".join(param),
)
def sdk_peer(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Each SDK server with the SDK client in each mode: (server URL, client mode)."""
    upstream, mode = request.param
    return request.getfixturevalue(upstream), mode


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[Any]:
    """A PostgreSQL server of this test's own, so it can be restarted."""
    import pgserver

    server = pgserver.get_server(tmp_path / "pg", cleanup_mode="delete")
    yield server
    server.cleanup()


# Fixtures of tests/helpers used across the suite (the SMTP inbox, the OTLP collector).
pytest_plugins = ["tests.helpers.mail", "tests.helpers.otlp"]


@pytest.fixture(autouse=True)
def cheap_password_hashing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Passwords are hashed with cheap argon2id parameters: behaviour is under test, not cost
    (tests marked real_password_hashing keep OWASP's)."""
    if request.node.get_closest_marker("real_password_hashing"):
        return
    hasher = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    monkeypatch.setattr(passwords, "_hasher", hasher)
    monkeypatch.setattr(passwords, "_DUMMY_HASH", hasher.hash("not-a-real-password"))
