"""/healthz and /readyz: alive whatever the database does; ready only while PostgreSQL answers
promptly, the schema is the expected one and the call log has room."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg

from gateway.calllog.records import ToolCall, new_call_id
from gateway.calllog.writer import CALL_LOG
from gateway.ops.readiness import DATABASE_BOUND_SECONDS, EXPECTED_SCHEMA_VERSION
from tests.helpers.api import Api, AppFactory, Reply
from tests.helpers.postgres import frozen
from tests.helpers.waiting import until


async def probe(api: Api, path: str, method: str = "GET") -> Reply:
    """A request outside /api/v1, as a load balancer sends it: no credentials."""
    async with api.client.request(method, path) as response:
        body = await response.json() if method == "GET" else None
        return Reply(response.status, body, response.headers)


async def test_both_answer_without_credentials(api: Api) -> None:
    alive = await probe(api, "/healthz")
    assert alive.status == 200
    assert alive.body == {"status": "alive", "worker": 0}
    assert alive.headers["Cache-Control"] == "no-store"
    ready = await probe(api, "/readyz")
    assert ready.status == 200
    assert ready.body == {"status": "ready"}
    for path in ("/healthz", "/readyz"):  # load balancers often probe with HEAD
        assert (await probe(api, path, "HEAD")).status == 200


async def test_another_schema_version_is_not_ready(api: Api, db: asyncpg.Connection) -> None:
    newer = EXPECTED_SCHEMA_VERSION + 1
    await db.execute("INSERT INTO schema_version (version) VALUES ($1)", newer)
    reply = await probe(api, "/readyz")
    assert reply.status == 503
    assert reply.detail == (
        f"not ready: schema: version {newer}, this gateway needs {EXPECTED_SCHEMA_VERSION}"
    )
    await db.execute("DELETE FROM schema_version WHERE version = $1", newer)
    assert (await probe(api, "/readyz")).status == 200


async def test_a_frozen_database_is_alive_but_not_ready_and_then_ready_again(
    own_postgres: Any,  # first: torn down after the app
    make_api: AppFactory,
) -> None:
    api = await make_api(database_url=own_postgres.get_uri())
    assert (await probe(api, "/readyz")).status == 200
    workspace_id = uuid.uuid4()
    call_log = api.app[CALL_LOG]
    call_log.max_rows = 10
    with frozen(own_postgres):
        assert (await probe(api, "/healthz")).body["status"] == "alive"
        started = time.monotonic()
        reply = await probe(api, "/readyz")
        assert reply.status == 503
        # A hang detector, not a timing target: the bound itself is measured in bench/.
        assert time.monotonic() - started < 20
        assert reply.detail == f"not ready: database: no answer within {DATABASE_BOUND_SECONDS:g} s"
        # Calls pile up while the database is away: near the bound, not ready for that too.
        for _ in range(9):
            call_log.add(
                ToolCall(
                    id=new_call_id(),
                    workspace_id=workspace_id,
                    server_id=uuid.uuid4(),
                    tool_name="t",
                    caller_agent=None,
                    status="success",
                    duration_ms=None,
                    input_tokens=None,
                    output_tokens=None,
                    output_size_bytes=None,
                    error_message=None,
                    created_at=datetime.now(UTC),
                )
            )
        reply = await probe(api, "/readyz")
        assert reply.status == 503
        assert reply.detail.endswith("; call log: 9 of at most 10 tool calls waiting to be stored")
    # Thawed: the calls (of no real server) are skipped once the writer retries, then ready.
    await until(lambda: not len(call_log), within=30)
    assert (await probe(api, "/readyz")).body["status"] == "ready"
