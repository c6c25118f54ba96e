"""A toolset served by two gateway processes at once, its requests alternating between them
(a load balancer without affinity): sessions and calls work whichever process answers, two
replicas or the two workers of `serve --workers 2`."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from tests.helpers.processes import SECRETS, environment
from tests.helpers.proxying import logged_calls, sdk_client
from tests.helpers.supervised import one_per_worker, supervised_gateway
from tests.helpers.toolsets import prefix
from tests.helpers.upstreams import free_port, serve_loopback

STARTUP_SECONDS = 90.0  # a hang guard: a loaded 2-core machine starts Python slowly
# What a load balancer must not pass on (hop-by-hop, and what aiohttp sets itself).
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@contextlib.contextmanager
def gateway_process(database_url: str, data_dir: Path) -> Iterator[str]:
    """`python -m gateway serve` on a free loopback port; stopped by PID at the end."""
    port = free_port()
    env = environment(
        DATABASE_URL=database_url,
        GATEWAY_DATA_DIR=str(data_dir),
        GATEWAY_AUTH_RATE_LIMIT="10000/minute",
        GATEWAY_RUN_WORKERS="false",
        **SECRETS,
    )
    args = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with (data_dir.parent / f"gateway-{port}.log").open("wb") as log:
        process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def ready(url: str) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    async with aiohttp.ClientSession() as http:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{url}/readyz") as response:
                    if response.status == 200:
                        return
            assert time.monotonic() < deadline, f"{url} not ready within {STARTUP_SECONDS} s"
            await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def alternating(
    backends: list[aiohttp.ClientSession],
) -> AsyncIterator[tuple[str, Counter[int]]]:
    """A loopback balancer sending each request to the next backend in turn (sessions with a
    base URL); yields its URL and how many requests each backend (by index) got."""
    turns = itertools.cycle(range(len(backends)))
    served: Counter[int] = Counter()

    async def forward(request: web.Request) -> web.StreamResponse:
        turn = next(turns)
        served[turn] += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with backends[turn].request(
            request.method, request.path_qs, data=await request.read(), headers=headers
        ) as reply:
            body = await reply.read()
            back = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP}
            return web.Response(status=reply.status, body=body, headers=back)

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", forward)
    async with serve_loopback(app) as url:
        yield url, served


async def arrange_shared_toolset(
    db: asyncpg.Connection, workspace_id: uuid.UUID, urls: list[str]
) -> tuple[str, list[str]]:
    """A toolset of a server per URL, made in the database every process reads."""
    toolset_id = await db.fetchval(
        "INSERT INTO toolsets (workspace_id, name) VALUES ($1, 'shared') RETURNING id",
        workspace_id,
    )
    names = []
    for position, url in enumerate(urls):
        name = f"member-{position}"
        server_id = await db.fetchval(
            "INSERT INTO servers (workspace_id, name, url) VALUES ($1, $2, $3) RETURNING id",
            workspace_id,
            name,
            url,
        )
        await db.execute(
            "INSERT INTO toolset_servers (toolset_id, server_id, position) VALUES ($1, $2, $3)",
            toolset_id,
            server_id,
            position,
        )
        names.append(name)
    return str(toolset_id), names


async def use_toolset(url: str, key: str, mode: str, names: list[str]) -> None:
    """Through the balancer: list, then call each member's `add` twice; no failure."""
    async with sdk_client(url, key, mode) as client:
        listed = await client.list_tools()
        results = [
            await client.call_tool(f"{prefix(name)}add", {"a": i, "b": 1})
            for i in range(2)
            for name in names
        ]
    assert {f"{prefix(name)}add" for name in names} <= {tool.name for tool in listed.tools}
    assert [r.structured_content for r in results] == [{"result": 1}] * 3 + [{"result": 2}] * 3
    assert not any(r.is_error for r in results)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_toolset_session_works_whichever_process_answers(
    database_url: str,
    db: asyncpg.Connection,
    tmp_path: Path,
    sdk_stateful: str,
    sdk_stateless: str,
    sdk_sse_url: str,
    mode: str,
) -> None:
    """Two `serve` processes (replicas) on one database."""
    with (
        gateway_process(database_url, tmp_path / "one") as one,
        gateway_process(database_url, tmp_path / "two") as two,
    ):
        await asyncio.gather(ready(one), ready(two))
        key, workspace_id = await _account(one)
        members = [sdk_stateful, sdk_stateless, sdk_sse_url]
        toolset_id, names = await arrange_shared_toolset(db, workspace_id, members)
        async with (
            aiohttp.ClientSession(one) as first,
            aiohttp.ClientSession(two) as second,
            alternating([first, second]) as (balancer, served),
        ):
            await use_toolset(f"{balancer}/api/v1/toolsets/{toolset_id}/mcp", key, mode, names)
    assert served[0] >= 3 and served[1] >= 3, served
    rows = await logged_calls(db, 6)
    assert {row["status"] for row in rows} == {"success"}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_toolset_session_works_whichever_worker_answers(
    database_url: str,
    db: asyncpg.Connection,
    tmp_path: Path,
    sdk_stateful: str,
    sdk_stateless: str,
    sdk_sse_url: str,
    mode: str,
) -> None:
    """`serve --workers 2`: each request goes to the other worker than the one before (a
    connection pinned to each, tests/helpers/supervised.py)."""
    async with supervised_gateway(database_url, tmp_path) as supervised:
        key, workspace_id = await _account(supervised.url)
        members = [sdk_stateful, sdk_stateless, sdk_sse_url]
        toolset_id, names = await arrange_shared_toolset(db, workspace_id, members)
        async with one_per_worker(supervised.url) as pinned:
            sessions = [pinned[worker].session for worker in sorted(pinned)]
            async with alternating(sessions) as (balancer, served):
                url = f"{balancer}/api/v1/toolsets/{toolset_id}/mcp"
                await use_toolset(url, key, mode, names)
            for each in pinned.values():
                assert len(each.opened) == 1, "a second connection: another worker?"
    assert served[0] >= 3 and served[1] >= 3, served
    rows = await logged_calls(db, 6)
    assert {row["status"] for row in rows} == {"success"}


async def _account(url: str) -> tuple[str, uuid.UUID]:
    async with aiohttp.ClientSession(url) as http:
        signup = {"email": "replicas@example.com", "password": "correct horse 1", "name": "R"}
        async with http.post("/api/v1/auth/signup", json=signup) as response:
            tokens = await response.json()
            assert response.status == 201, tokens
        workspace_id = tokens["workspace"]["id"]
        auth = {"Authorization": f"Bearer {tokens['access_token']}"}
        async with http.post(
            f"/api/v1/workspaces/{workspace_id}/api-keys", json={"name": "agent"}, headers=auth
        ) as response:
            created = await response.json()
            assert response.status == 201, created
    return created["key"], uuid.UUID(workspace_id)
