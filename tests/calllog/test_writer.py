"""The call log writer on real PostgreSQL: batches, rollups, histograms, bounds, failures."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from uuid_utils.compat import uuid7

from gateway.calllog.records import ToolCall
from gateway.calllog.writer import CALL_LOG, CallLog, RowsRejected
from gateway.db import rollups
from gateway.db import tool_calls as tool_calls_db
from gateway.db.histograms import latency_bucket, percentile
from gateway.db.partitions import floor_day
from gateway.db.pool import create_pool
from gateway.db.types import Connection
from gateway.errors import ServiceUnavailable
from tests.helpers.analytics import snapshot
from tests.helpers.api import Api
from tests.helpers.postgres import restart_postgres
from tests.helpers.proxying import add_server, call, recorder

AppFactory = Callable[..., Awaitable[Api]]


# -- the writer --------------------------------------------------------------------------------


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, min_size=1, max_size=4)
    yield pool
    await pool.close()


@pytest.fixture
async def servers(db: asyncpg.Connection) -> tuple[uuid.UUID, list[uuid.UUID]]:
    workspace = await db.fetchval(
        "INSERT INTO workspaces (name, slug) VALUES ('w', $1) RETURNING id",
        f"w-{secrets.token_hex(4)}",
    )
    ids = [
        await db.fetchval(
            "INSERT INTO servers (workspace_id, name, url) VALUES ($1, $2, 'http://x') "
            "RETURNING id",
            workspace,
            name,
        )
        for name in ("one", "two")
    ]
    return workspace, ids


@contextlib.asynccontextmanager
async def server_held(db: asyncpg.Connection, server: uuid.UUID) -> AsyncIterator[None]:
    """Another transaction holds the server's row: a batch naming it waits until the block ends."""
    async with db.transaction():
        await db.execute("SELECT 1 FROM servers WHERE id = $1 FOR UPDATE", server)
        yield


def record(
    workspace: uuid.UUID,
    server: uuid.UUID,
    tool: str = "t",
    *,
    duration: int | None = 10,
    status: str = "success",
    at: datetime | None = None,
    toolset: uuid.UUID | None = None,
) -> ToolCall:
    return ToolCall(
        id=uuid7(),
        workspace_id=workspace,
        server_id=server,
        tool_name=tool,
        caller_agent=None,
        status=status,
        duration_ms=duration,
        input_tokens=None,
        output_tokens=None,
        output_size_bytes=100,
        error_message=None if status == "success" else "failed",
        created_at=at or datetime.now(UTC),
        toolset_id=toolset,
    )


async def add_toolsets(
    db: asyncpg.Connection, workspace: uuid.UUID, *names: str
) -> list[uuid.UUID]:
    """Toolset rows of the workspace (plain SQL: their API is not the call log's business)."""
    return [
        await db.fetchval(
            "INSERT INTO toolsets (workspace_id, name) VALUES ($1, $2) RETURNING id",
            workspace,
            name,
        )
        for name in names
    ]


def test_a_tool_calls_fields_are_the_columns_it_is_copied_into() -> None:
    """The writer COPYs ToolCall tuples into these columns, in this order; it reads a record's
    fields by their place in COLUMNS."""
    assert ToolCall._fields == tool_calls_db.COLUMNS


def bucketed(durations: list[int]) -> list[int]:
    """The latency histogram of some durations, built here (as stored: up to the highest bucket
    counted)."""
    histogram: list[int] = []
    for duration in durations:
        bucket = latency_bucket(duration)
        histogram.extend([0] * (bucket + 1 - len(histogram)))
        histogram[bucket] += 1
    return histogram


async def test_calls_through_toolsets_are_rolled_up_apart(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    """The toolset is part of every rollup key: a tool's calls through a toolset count in rows
    of their own, beside those of its direct calls (toolset null), and in the toolset's latency
    histograms, besides the workspace's and the server's. Batches upserting the same keys add
    up to what a rebuild computes."""
    workspace, (server, other) = servers
    research, ops = await add_toolsets(db, workspace, "research", "ops")
    rng = random.Random(31)
    hour = floor_day(datetime.now(UTC)) - timedelta(days=2) + timedelta(hours=10)
    calls = [
        record(
            workspace,
            rng.choice([server, other]),
            rng.choice(["search", "fetch"]),
            duration=None if i % 40 == 0 else int(rng.lognormvariate(5, 1.2)),
            status="error" if i % 6 == 0 else "success",
            at=hour + timedelta(minutes=rng.randrange(150)),
            toolset=rng.choice([None, research, ops]),
        )._replace(caller_agent=rng.choice([None, "planner", "coder"]))
        for i in range(3000)
    ]
    log = CallLog(pool, batch_rows=400)
    log.start()
    await log.write(calls)
    await log.close()
    assert log.stats.written == len(calls)

    def hour_of(call: ToolCall) -> datetime:
        return call.created_at.replace(minute=0, second=0, microsecond=0)

    counts: dict[tuple[Any, ...], list[int]] = {}
    callers: dict[tuple[Any, ...], list[int]] = {}
    durations: dict[tuple[uuid.UUID, datetime], list[int]] = {}
    for c in calls:
        key = (c.server_id, c.tool_name, hour_of(c), c.toolset_id)
        counts.setdefault(key, [0, 0])[0] += 1
        counts[key][1] += c.status == "error"
        if c.caller_agent is not None:
            by_caller = callers.setdefault((c.caller_agent, *key), [0, 0])
            by_caller[0] += 1
            by_caller[1] += c.status == "error"
        if c.duration_ms is not None:
            for scope in (workspace, c.server_id, c.toolset_id):
                if scope is not None:
                    durations.setdefault((scope, hour_of(c)), []).append(c.duration_ms)
    rows = await db.fetch("SELECT * FROM tool_call_hourly")
    assert {
        (r["server_id"], r["tool_name"], r["hour"], r["toolset_id"]): [
            r["call_count"],
            r["error_count"],
        ]
        for r in rows
    } == counts
    assert len(rows) == len(counts)  # one row per key: null toolsets are one value
    rows = await db.fetch("SELECT * FROM tool_call_caller_hourly")
    assert {
        (r["caller_agent"], r["server_id"], r["tool_name"], r["hour"], r["toolset_id"]): [
            r["call_count"],
            r["error_count"],
        ]
        for r in rows
    } == callers
    rows = await db.fetch("SELECT scope, hour, latency_histogram FROM latency_hourly")
    assert {(r["scope"], r["hour"]): r["latency_histogram"] for r in rows} == {
        key: bucketed(values) for key, values in durations.items()
    }

    written = await snapshot(db)
    async with pool.acquire() as conn:
        await rollups.rebuild(conn)
    assert await snapshot(db) == written


async def test_rollups_and_percentiles_match_the_rows(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, other) = servers
    rng = random.Random(7)
    hour = floor_day(datetime.now(UTC)) - timedelta(days=2) + timedelta(hours=10)
    calls = [
        record(
            workspace,
            rng.choice([server, other]),
            rng.choice(["search", "fetch"]),
            duration=None if i % 50 == 0 else int(rng.lognormvariate(5, 1.2)),
            status="error" if i % 7 == 0 else "success",
            at=hour + timedelta(minutes=rng.randrange(120)),
        )
        for i in range(5000)
    ]
    log = CallLog(pool, batch_rows=700)
    log.start()
    for c in calls[:2500]:
        log.add(c)
    await log.write(calls[2500:])
    await log.close()
    assert log.stats.written == 5000
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 5000
    rollups = await db.fetch("SELECT * FROM tool_call_hourly")
    assert {r["hour"] for r in rollups} == {hour, hour + timedelta(hours=1)}
    assert sum(r["call_count"] for r in rollups) == 5000
    assert sum(r["error_count"] for r in rollups) == sum(c.status == "error" for c in calls)
    timed = [c.duration_ms for c in calls if c.duration_ms is not None]
    assert sum(r["duration_count"] for r in rollups) == len(timed)
    assert sum(r["duration_sum_ms"] for r in rollups) == sum(timed)
    # Percentiles read back from the merged histograms, against the exact nearest-rank ones.
    histogram: list[int] = await db.fetchval(
        "SELECT histogram_sum(latency_histogram) FROM tool_call_hourly"
    )
    exact = sorted(timed)
    for fraction in (0.5, 0.95, 0.99):
        value = exact[math.ceil(fraction * len(exact)) - 1]
        estimate = percentile(histogram, fraction)
        assert estimate is not None
        assert abs(estimate - value) / value <= 0.01, (fraction, estimate, value)


async def test_batch_survives_a_deleted_server_and_retries_do_not_duplicate(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, doomed) = servers
    # Over several days, so over several partitions of tool_calls.
    now = datetime.now(UTC)
    batch = [
        record(workspace, server, at=now - timedelta(days=3)),
        record(workspace, doomed),
        record(workspace, server, at=now - timedelta(days=1)),
        record(workspace, server),
    ]
    await db.execute("DELETE FROM servers WHERE id = $1", doomed)
    async with pool.acquire() as conn:
        assert await tool_calls_db.write_batch(conn, batch[:3]) == 2
        # Again with one more row, as after a commit whose acknowledgement was lost.
        assert await tool_calls_db.write_batch(conn, batch) == 1
        assert await tool_calls_db.write_batch(conn, batch) == 0
        # Without the check for stored ids, the key (id, created_at) refuses the rows.
        with pytest.raises(asyncpg.UniqueViolationError):
            await tool_calls_db.write_batch(conn, batch, retry=False)
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 3
    assert await db.fetchval("SELECT sum(call_count) FROM tool_call_hourly") == 3


async def test_deleting_a_server_deletes_its_calls(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, other) = servers
    async with pool.acquire() as conn:
        await tool_calls_db.write_batch(conn, [record(workspace, server), record(workspace, other)])
    await db.execute("DELETE FROM servers WHERE id = $1", server)
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 1
    assert await db.fetchval("SELECT count(*) FROM tool_call_hourly") == 1


async def test_a_server_deleted_while_its_batch_is_in_flight_loses_its_calls_too(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, other) = servers
    async with pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        await tool_calls_db.write_batch(conn, [record(workspace, server), record(workspace, other)])
        # The batch holds its servers until it commits: the delete has to wait for it...
        deleting = asyncio.create_task(db.execute("DELETE FROM servers WHERE id = $1", server))
        await asyncio.sleep(0.3)
        assert not deleting.done()
        await transaction.commit()
    await deleting
    # ...and then removes the rows the batch committed, as a cascade would.
    assert await db.fetchval("SELECT count(*) FROM tool_calls WHERE server_id = $1", server) == 0
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 1


async def test_concurrent_batches_and_a_deleted_server_keep_every_rollup_exact(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    """Writers on several connections upsert the same rollup keys (shuffled batches, calls
    through toolsets among them) while a server is deleted: nobody deadlocks, and every rollup
    table is what a rebuild computes (the doomed server's durations left the toolsets'
    histograms too)."""
    workspace, (server, other) = servers
    doomed = await db.fetchval(
        "INSERT INTO servers (workspace_id, name, url) VALUES ($1, 'doomed', 'http://x') "
        "RETURNING id",
        workspace,
    )
    toolsets = await add_toolsets(db, workspace, "research", "ops")
    rng = random.Random(8)
    hour = floor_day(datetime.now(UTC)) - timedelta(days=2) + timedelta(hours=10)

    def batch() -> list[ToolCall]:
        return [
            ToolCall(
                id=uuid7(),
                workspace_id=workspace,
                server_id=rng.choice([server, other, doomed]),
                tool_name=rng.choice(["search", "fetch", "read"]),
                caller_agent=rng.choice([None, "planner", "coder"]),
                status=rng.choice(["success", "error"]),
                duration_ms=None if rng.random() < 0.1 else int(rng.lognormvariate(5, 1.5)),
                input_tokens=None,
                output_tokens=None,
                output_size_bytes=None,
                error_message=None,
                created_at=hour + timedelta(minutes=rng.randrange(180)),
                toolset_id=rng.choice([None, *toolsets]),
            )
            for _ in range(300)
        ]

    async def writer() -> None:
        async with pool.acquire() as conn:
            for _ in range(12):
                await tool_calls_db.write_batch(conn, batch())

    async def delete_midway() -> None:
        await asyncio.sleep(0.1)
        await db.execute("DELETE FROM servers WHERE id = $1", doomed)

    await asyncio.gather(writer(), writer(), writer(), delete_midway())
    assert await db.fetchval("SELECT count(*) FROM tool_calls WHERE server_id = $1", doomed) == 0
    written = await snapshot(db)
    assert sum(r["call_count"] for r in written["tool_call_hourly"]) == await db.fetchval(
        "SELECT count(*) FROM tool_calls"
    )
    assert {r["scope"] for r in written["latency_hourly"]} >= {*toolsets, workspace}
    async with pool.acquire() as conn:
        await rollups.rebuild(conn)
    assert await snapshot(db) == written


async def waiting_for_a_lock(db: asyncpg.Connection, conn: Connection) -> None:
    """Return once `conn`'s statement waits for a lock another transaction holds."""
    pid = conn.get_server_pid()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        query = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1"
        if await db.fetchval(query, pid) == "Lock":
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited for a lock")


async def test_a_workspace_deleted_while_its_batch_is_in_flight_waits_for_it(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    """The batch's latency upsert needs its workspace row (a foreign key) while a workspace
    delete needs the batch's servers: the batch holds the workspace from its start, so the delete
    waits for it instead of the two deadlocking."""
    workspace, (server, _) = servers
    async with pool.acquire() as holder, pool.acquire() as writer, pool.acquire() as deleter:
        # Another transaction holds latency_hourly: the batch stops right before that upsert.
        held = holder.transaction()
        await held.start()
        await holder.execute("LOCK TABLE latency_hourly IN SHARE MODE")
        writing = asyncio.create_task(
            tool_calls_db.write_batch(writer, [record(workspace, server)])
        )
        await waiting_for_a_lock(db, writer)
        deleting = asyncio.create_task(
            deleter.execute("DELETE FROM workspaces WHERE id = $1", workspace)
        )
        await waiting_for_a_lock(db, deleter)
        await held.rollback()
        assert await writing == 1
        await deleting
    rows = await snapshot(db)
    assert not any(rows.values())
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 0


async def test_a_workspace_deleted_during_a_rebuild_waits_for_it(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, other) = servers
    async with pool.acquire() as holder, pool.acquire() as rebuilder, pool.acquire() as deleter:
        await tool_calls_db.write_batch(
            holder, [record(workspace, server), record(workspace, other)]
        )
        # Another transaction holds tool_calls: the rebuild stops before reading it, holding
        # whatever it took first.
        held = holder.transaction()
        await held.start()
        await holder.execute("LOCK TABLE tool_calls IN ACCESS EXCLUSIVE MODE")
        rebuilding = asyncio.create_task(rollups.rebuild(rebuilder))
        await waiting_for_a_lock(db, rebuilder)
        deleting = asyncio.create_task(
            deleter.execute("DELETE FROM workspaces WHERE id = $1", workspace)
        )
        await waiting_for_a_lock(db, deleter)
        await held.rollback()
        rebuilt = await rebuilding
        await deleting
    assert rebuilt.inserted > 0
    rows = await snapshot(db)
    assert not any(rows.values())


async def test_rows_naming_a_server_of_another_workspace_are_skipped(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, _) = servers
    async with pool.acquire() as conn:
        written = await tool_calls_db.write_batch(
            conn, [record(workspace, server), record(uuid.uuid4(), server)]
        )
    assert written == 1
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 1
    assert await db.fetchval("SELECT sum(call_count) FROM tool_call_hourly") == 1


async def test_a_refused_write_stores_nothing_and_holds_back_nothing(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    """The rows of one write() are stored together or not at all: its caller gets one answer."""
    workspace, (server, _) = servers
    log = CallLog(pool)
    log.start()
    good = [record(workspace, server) for _ in range(3)]
    bad = record(workspace, server, status="maybe")  # violates the CHECK
    with pytest.raises(RowsRejected):
        await log.write([good[0], bad, good[1]])
    await log.write([good[2]])
    await log.close()
    assert await db.fetchval("SELECT array_agg(id) FROM tool_calls") == [good[2].id]
    assert log.stats.rejected == 3


def unstorable(workspace: uuid.UUID, server: uuid.UUID) -> list[ToolCall]:
    """Rows that get past nothing but a bug: each fails a COPY in its own way."""
    row = record(workspace, server, "bad")
    return [
        row._replace(caller_agent="agent-\udcff"),  # cannot be encoded
        row._replace(id=uuid7(), caller_agent=secrets.token_hex(2000)),  # over an index entry
        row._replace(id=uuid7(), status="maybe"),  # violates the CHECK
        row._replace(id=uuid7(), duration_ms="ten"),  # type: ignore[arg-type]
    ]


async def test_bad_rows_are_set_aside_and_the_rest_of_their_batch_written_at_once(
    pool: asyncpg.Pool,
    db: asyncpg.Connection,
    servers: tuple[uuid.UUID, list[uuid.UUID]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One tenant's unstorable rows in the middle of another's load: the batch is split, every
    good row is stored at once (nothing waits for a retry: no failure is counted), each bad row
    is logged once with its workspace and counted."""
    workspace, (server, _) = servers
    other_workspace = await db.fetchval(
        "INSERT INTO workspaces (name, slug) VALUES ('o', $1) RETURNING id",
        f"o-{secrets.token_hex(4)}",
    )
    other_server = await db.fetchval(
        "INSERT INTO servers (workspace_id, name, url) VALUES ($1, 'o', 'http://o') RETURNING id",
        other_workspace,
    )
    log = CallLog(pool, batch_rows=2000)
    log.start()
    bad = unstorable(other_workspace, other_server)
    good = [record(workspace, server) for _ in range(1000)]
    for i, row in enumerate(good):
        log.add(row)
        if i % 250 == 100:
            log.add(bad[i // 250])
    started = time.monotonic()
    while time.monotonic() - started < 30.0:  # a hang guard: the stats below say "at once"
        if await db.fetchval("SELECT count(*) FROM tool_calls") == len(good):
            break
        await asyncio.sleep(0.01)
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == len(good)
    assert await db.fetchval("SELECT sum(call_count) FROM tool_call_hourly") == len(good)
    await log.close(drain_seconds=1)
    assert (log.stats.written, log.stats.rejected, log.stats.failures) == (1000, 4, 0)
    assert len(log) == 0
    set_aside = [r for r in caplog.records if "set aside" in r.getMessage()]
    assert len(set_aside) == 4
    assert all(str(other_workspace) in r.getMessage() for r in set_aside)


async def test_a_batch_split_by_a_bad_row_and_stopped_by_a_lock_goes_on_later(
    database_url: str, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    """While a refused batch is written in parts, a part meets a failure of the moment: what
    is left (neither written nor set aside) is retried later as a batch of its own, and the
    write() among it is answered once its rows are stored."""
    workspace, (held, free) = servers
    pool = await asyncpg.create_pool(
        database_url, min_size=1, max_size=4, server_settings={"lock_timeout": "20ms"}
    )
    assert pool is not None
    log = CallLog(pool, flush_seconds=0.05)
    log.start()
    try:
        async with server_held(db, held):
            bad = record(workspace, free)._replace(workspace_id="not a uuid")  # type: ignore[arg-type]
            log.add(bad)
            for _ in range(5):
                log.add(record(workspace, free))
            waited = [record(workspace, held) for _ in range(3)]
            writing = asyncio.create_task(log.write(waited))
            for _ in range(5):
                log.add(record(workspace, free))
            for _ in range(3000):
                if log.stats.failures:
                    break
                await asyncio.sleep(0.01)
            assert log.stats.rejected == 1
            # The parts before the one that met the lock are in.
            assert await db.fetchval("SELECT count(*) FROM tool_calls") >= 5
            assert not writing.done()
        await asyncio.wait_for(writing, 10)
        await log.close()
        assert (
            await db.fetchval(
                "SELECT count(*) FROM tool_calls WHERE id = ANY($1::uuid[])", [r.id for r in waited]
            )
            == 3
        )
        assert await db.fetchval("SELECT count(*) FROM tool_calls") == 13
        assert (log.stats.written, log.stats.rejected, len(log)) == (13, 1, 0)
    finally:
        await pool.close()


async def test_a_batch_that_keeps_failing_backs_off_on_its_own(
    database_url: str,
    db: asyncpg.Connection,
    servers: tuple[uuid.UUID, list[uuid.UUID]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch failing for the moment (here: a lock it cannot get) waits longer before each
    attempt, while the batches behind it are written at once (their success does not shorten
    its wait)."""
    workspace, (server, other) = servers
    pool = await asyncpg.create_pool(
        database_url, min_size=1, max_size=4, server_settings={"lock_timeout": "20ms"}
    )
    assert pool is not None
    log = CallLog(pool)
    log.start()

    def delays() -> list[str]:
        return [
            r.getMessage().rsplit(" ", 2)[1]
            for r in caplog.records
            if r.getMessage().startswith("cannot write 1 tool calls (LockNotAvailableError")
        ]

    try:
        async with server_held(db, server):
            log.add(record(workspace, server))
            deadline = time.monotonic() + 30
            for _ in range(3000):  # its first attempt, alone
                if delays():
                    break
                await asyncio.sleep(0.01)
            written = 0
            while len(delays()) < 4 and time.monotonic() < deadline:
                await asyncio.wait_for(log.write([record(workspace, other)]), 10)
                written += 1
            assert delays()[:4] == ["0.05", "0.10", "0.20", "0.40"]
            await log.close(drain_seconds=0.2)  # the failing batch is given up at shutdown...
        assert await db.fetchval("SELECT count(*) FROM tool_calls") == written
        assert len(log) == 0 and log.stats.dropped == 1  # ...and counted as dropped
        assert log.stats.rejected == 0  # a failure of the moment is not the rows' fault
        log.add(record(workspace, server))  # so is a call arriving after shutdown
        assert len(log) == 0 and log.stats.dropped == 2
    finally:
        await pool.close()


async def test_shutdown_fails_the_writes_it_gives_up_on(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, _) = servers
    log = CallLog(pool)
    log.start()
    async with server_held(db, server):  # its batch cannot be written before shutdown
        writing = asyncio.create_task(log.write([record(workspace, server)]))
        await asyncio.sleep(0.2)
        await log.close(drain_seconds=0.2)
        with pytest.raises(ServiceUnavailable):
            await asyncio.wait_for(writing, 5)
        assert len(log) == 0


class _NeverWrites(CallLog):
    """Its batches never get anywhere, and have no cleanup of their own: like a writer task
    cancelled before it first ran."""

    async def _write_batch(self, *args: Any) -> None:
        await asyncio.Event().wait()


async def test_shutdown_fails_the_writes_of_batches_that_never_ran(
    pool: asyncpg.Pool, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, _) = servers
    log = _NeverWrites(pool)
    log.start()
    writing = asyncio.create_task(log.write([record(workspace, server)]))
    await asyncio.sleep(0.1)
    await log.close(drain_seconds=0.1)
    with pytest.raises(ServiceUnavailable):
        await asyncio.wait_for(writing, 5)
    assert len(log) == 0


async def test_batches_queue_behind_a_rebuild_with_their_statements_prepared(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    """A batch's rollup upsert, once prepared on its connection, would lock latency_hourly (its
    main INSERT) before the other rollup tables; a rebuild locks them in TABLES order. Batches
    lock the tables in that order first, so one arriving while a rebuild waits queues behind
    it instead of deadlocking with it."""
    workspace, (server, other) = servers
    async with pool.acquire() as holder, pool.acquire() as rebuilder, pool.acquire() as writer:
        for _ in range(6):  # statements prepared and their plans cached on this connection
            await tool_calls_db.write_batch(writer, [record(workspace, server)])
        # A batch in flight holds tool_call_hourly: the rebuild waits for it.
        held = holder.transaction()
        await held.start()
        await holder.execute("LOCK TABLE tool_call_hourly IN ROW EXCLUSIVE MODE")
        rebuilding = asyncio.create_task(rollups.rebuild(rebuilder))
        await waiting_for_a_lock(db, rebuilder)
        writing = asyncio.create_task(tool_calls_db.write_batch(writer, [record(workspace, other)]))
        await waiting_for_a_lock(db, writer)
        await held.rollback()
        await rebuilding
        assert await writing == 1
    written = await snapshot(db)
    assert sum(r["call_count"] for r in written["tool_call_hourly"]) == 7
    async with pool.acquire() as conn:
        await rollups.rebuild(conn)
    assert await snapshot(db) == written


async def test_the_queue_is_bounded(
    pool: asyncpg.Pool, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, _) = servers
    log = CallLog(pool, max_rows=10)  # not started: nothing leaves the queue
    for _ in range(15):
        log.add(record(workspace, server))
    assert len(log) == 10
    assert log.stats.dropped == 5
    with pytest.raises(ServiceUnavailable):
        await log.write([record(workspace, server)])


async def test_room_given_back_is_room_again(
    pool: asyncpg.Pool, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    """Room reserved for calls that turned out to be no rows (an interim answer) goes back,
    exactly: the workspace's share counts only rows to come."""
    workspace, (server, _) = servers
    log = CallLog(pool, max_rows=8, workspace_share=0.5)  # not started; a share of 4 rows
    held = log.reserve(workspace, 4)
    assert held is not None and log.reserve(workspace, 1) is None
    log.release(held, 3)
    log.add(record(workspace, server), held)  # the one still reserved turns into its row
    assert len(log) == 1
    assert log.reserve(workspace, 3) is held  # the row waiting and these fill the share
    assert log.reserve(workspace, 1) is None
    log.release(held, 3)
    assert log.reserve(workspace, 3) is held


async def test_shutdown_drains_the_queue_without_calling_it_a_death(
    pool: asyncpg.Pool,
    db: asyncpg.Connection,
    servers: tuple[uuid.UUID, list[uuid.UUID]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    workspace, (server, _) = servers
    log = CallLog(pool, flush_seconds=30.0, batch_rows=10_000)
    log.start()
    for _ in range(250):
        log.add(record(workspace, server))
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING):
        await log.close()
        await asyncio.sleep(0)  # the writer task's done callbacks
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 250
    assert [r.getMessage() for r in caplog.records] == []


async def test_app_shutdown_drains_before_the_pool_closes(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_api()
    owner = await api.signup()
    key = await api.api_key(owner)
    async with recorder() as upstream:
        server_id = await add_server(api, db, owner, upstream.url)
        for i in range(20):
            await api.post(f"/proxy/{server_id}/mcp", json=call("t", i), auth=key, expect=200)
    await api.client.close()  # the app's cleanup: the call log drains, then the pool closes
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 20


# -- a real PostgreSQL restart under traffic ---------------------------------------------------


async def test_postgres_restart_loses_no_acknowledged_call(
    own_postgres: Any,  # first: torn down after the app, which drains into it
    make_api: AppFactory,
) -> None:
    dsn = own_postgres.get_uri()
    api = await make_api(database_url=dsn)
    owner = await api.signup()
    key = await api.api_key(owner)
    db = await asyncpg.connect(dsn)
    acknowledged_proxy = 0
    acknowledged_ids: list[str] = []
    restarted = asyncio.Event()
    try:
        async with recorder() as upstream:
            server_id = await add_server(api, db, owner, upstream.url)
            await db.close()

            async def proxy_traffic() -> None:
                nonlocal acknowledged_proxy
                deadline = time.monotonic() + 60
                sent = 0
                while (sent < 150 or not restarted.is_set()) and time.monotonic() < deadline:
                    sent += 1
                    reply = await api.post(
                        f"/proxy/{server_id}/mcp", json=call("proxied", sent), auth=key
                    )
                    if reply.status == 200:
                        acknowledged_proxy += 1
                    else:
                        assert reply.status == 503, reply  # auth lookup while PG is away
                        await asyncio.sleep(0.05)

            async def ingestion_traffic() -> None:
                deadline = time.monotonic() + 60
                sent = 0
                while (sent < 60 or not restarted.is_set()) and time.monotonic() < deadline:
                    sent += 1
                    body = [
                        {"server_id": server_id, "tool_name": "ingested", "status": "success"}
                        for _ in range(5)
                    ]
                    reply = await api.post("/tool-calls", json=body, auth=key)
                    if reply.status == 201:
                        acknowledged_ids.extend(item["id"] for item in reply.body["items"])
                    else:
                        assert reply.status == 503, reply
                        await asyncio.sleep(0.05)

            async def restart_midway() -> None:
                await asyncio.sleep(0.5)
                await asyncio.to_thread(restart_postgres, own_postgres)
                restarted.set()

            await asyncio.gather(proxy_traffic(), ingestion_traffic(), restart_midway())
        assert acknowledged_proxy >= 100 and len(acknowledged_ids) >= 100
        db = await asyncpg.connect(dsn)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            proxied = await db.fetchval(
                "SELECT count(*) FROM tool_calls WHERE tool_name = 'proxied'"
            )
            if proxied >= acknowledged_proxy:
                break
            await asyncio.sleep(0.1)
        assert proxied == acknowledged_proxy
        stored = await db.fetch("SELECT id::text FROM tool_calls WHERE tool_name = 'ingested'")
        assert {r["id"] for r in stored} == set(acknowledged_ids)
        assert await db.fetchval("SELECT sum(call_count) FROM tool_call_hourly") == (
            await db.fetchval("SELECT count(*) FROM tool_calls")
        )
        assert api.app[CALL_LOG].stats.failures >= 1
    finally:
        await db.close()


async def test_a_stuck_batch_does_not_hold_back_the_next(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, other) = servers
    log = CallLog(pool)
    log.start()
    async with server_held(db, server):  # the first server's batch waits for it...
        stuck = asyncio.create_task(log.write([record(workspace, server)]))
        await asyncio.sleep(0.2)
        # ...while a batch for the other server is written beside it.
        await asyncio.wait_for(log.write([record(workspace, other)]), 10)
        assert not stuck.done()
    await stuck
    await log.close()
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 2


async def test_proxied_calls_gather_behind_the_batch_in_flight(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, other) = servers
    log = CallLog(pool)
    log.start()
    async with server_held(db, server):
        log.add(record(workspace, server))  # its batch waits for the held server...
        await asyncio.sleep(0.2)
        for _ in range(3):  # ...and these, which nobody waits on, wait for that batch to end
            log.add(record(workspace, other))
        await asyncio.sleep(0.3)
        assert await db.fetchval("SELECT count(*) FROM tool_calls") == 0
        assert log.stats.batches == 0
    await log.close()
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 4
    assert log.stats.batches == 2  # the held one, then the three gathered behind it


async def test_proxied_calls_gather_until_a_write_waits_for_its_commit(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, _) = servers
    log = CallLog(pool, gather_seconds=30.0)  # longer than this test: only a write ends it
    log.start()
    for _ in range(3):  # the proxy's rows: nobody waits for their commit, so they gather...
        log.add(record(workspace, server))
    await asyncio.sleep(0.3)
    assert log.stats.batches == 0
    # ...until a caller waits for its own rows' commit: then all are written at once.
    await asyncio.wait_for(log.write([record(workspace, server)]), 10)
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 4
    assert log.stats.batches == 1
    await log.close()


async def test_gathered_calls_are_written_without_anyone_waiting(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, _) = servers
    log = CallLog(pool, gather_seconds=0.2)
    log.start()
    log.add(record(workspace, server))
    deadline = time.monotonic() + 10
    while await db.fetchval("SELECT count(*) FROM tool_calls") < 1:
        assert time.monotonic() < deadline, "a gathered call was never written"
        await asyncio.sleep(0.05)
    await log.close()


async def test_a_full_batch_is_written_beside_a_stuck_one(
    pool: asyncpg.Pool, db: asyncpg.Connection, servers: tuple[uuid.UUID, list[uuid.UUID]]
) -> None:
    workspace, (server, other) = servers
    log = CallLog(pool, batch_rows=3)
    log.start()
    async with server_held(db, server):
        log.add(record(workspace, server))
        await asyncio.sleep(0.2)
        for _ in range(3):
            log.add(record(workspace, other))
        deadline = time.monotonic() + 10
        while await db.fetchval("SELECT count(*) FROM tool_calls") < 3:
            assert time.monotonic() < deadline, "the full batch waited for the stuck one"
            await asyncio.sleep(0.05)
    await log.close()
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 4
