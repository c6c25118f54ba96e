"""With PostgreSQL frozen (SIGSTOP), callers get a 503 with Retry-After within the configured
bounds instead of hanging, and tool calls refused with a 503 never appear later."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg

from tests.helpers.api import AppFactory
from tests.helpers.postgres import frozen
from tests.helpers.proxying import add_server

# Generous: the bounds under test are a fraction of this (a slow CI machine is not a hang).
_GUARD_SECONDS = 20


async def test_a_frozen_database_is_a_prompt_503_and_takes_back_unwritten_calls(
    own_postgres: Any,  # first: torn down after the app
    make_api: AppFactory,
) -> None:
    dsn = own_postgres.get_uri()
    api = await make_api(
        database_url=dsn, db_acquire_timeout_seconds=0.5, db_statement_timeout_seconds=1.0
    )
    owner = await api.signup("frozen@example.com")
    key = await api.api_key(owner)
    db = await asyncpg.connect(dsn)
    server_id = await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    await db.close()
    await api.get("/servers", auth=key, expect=200)  # the key's and the server's caches warm
    refused = [{"server_id": server_id, "tool_name": "refused", "status": "success"}] * 3

    with frozen(own_postgres):
        started = time.monotonic()
        replies = await asyncio.wait_for(
            asyncio.gather(
                api.get("/servers", auth=owner),
                api.post(
                    "/auth/login", json={"email": "frozen@example.com", "password": "password123"}
                ),
                api.post("/tool-calls", json=refused, auth=key),
            ),
            _GUARD_SECONDS,
        )
        waited = time.monotonic() - started
    for reply in replies:
        assert reply.status == 503, reply
        assert reply.headers["Retry-After"] == "1"
    assert waited < _GUARD_SECONDS

    # Back: the gateway recovers by itself, and what it answered 503 for never shows up.
    accepted = [{"server_id": server_id, "tool_name": "accepted", "status": "success"}]
    for _ in range(100):
        reply = await api.post("/tool-calls", json=accepted, auth=key)
        if reply.status == 201:
            break
        await asyncio.sleep(0.1)
    assert reply.status == 201
    await asyncio.sleep(1.5)  # longer than any batch attempt may take
    db = await asyncpg.connect(dsn)
    try:
        names = [r["tool_name"] for r in await db.fetch("SELECT tool_name FROM tool_calls")]
    finally:
        await db.close()
    assert names == ["accepted"]
    await api.get("/servers", auth=owner, expect=200)
