"""tool_calls by UTC day: partitions made ahead (by several processes at once), a write that
finds none making its own, expired days detached concurrently (an old reader neither blocked
nor blocking anyone else) and dropped by one process at a time."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from gateway.calllog.records import ToolCall, new_call_id
from gateway.db import partitions
from gateway.db import tool_calls as tool_calls_db
from gateway.db.partitions import DAY, GRACE, day_name, floor_day
from gateway.db.schema import apply_schema

HOUR = timedelta(hours=1)


@pytest.fixture
async def conns(database_url: str) -> AsyncIterator[list[asyncpg.Connection]]:
    """Three connections: as many gateway processes."""
    opened = [await asyncpg.connect(database_url) for _ in range(3)]
    yield opened
    for conn in opened:
        await conn.close()


async def server(db: asyncpg.Connection) -> tuple[uuid.UUID, uuid.UUID]:
    workspace_id = await db.fetchval(
        "INSERT INTO workspaces (name, slug) VALUES ('W', $1) RETURNING id", uuid.uuid4().hex
    )
    server_id = await db.fetchval(
        "INSERT INTO servers (workspace_id, name, url) VALUES ($1, 's', 'http://x.test') "
        "RETURNING id",
        workspace_id,
    )
    return workspace_id, server_id


def call(workspace_id: uuid.UUID, server_id: uuid.UUID, at: datetime) -> ToolCall:
    return ToolCall(
        id=new_call_id(),
        workspace_id=workspace_id,
        server_id=server_id,
        tool_name="t",
        caller_agent=None,
        status="success",
        duration_ms=1,
        input_tokens=None,
        output_tokens=None,
        output_size_bytes=None,
        error_message=None,
        created_at=at,
    )


async def names(db: asyncpg.Connection) -> list[str]:
    return [p.name for p in await partitions.partitions(db)]


async def test_the_days_kept_and_the_next_ones_have_partitions(db: asyncpg.Connection) -> None:
    # As every gateway process does at start (the test's database is a copy of a template made
    # when the session began, maybe the day before).
    await apply_schema(db)
    today = floor_day(datetime.now(UTC))
    found = await partitions.partitions(db)
    assert all(p.attached and not p.detaching for p in found)
    starts = [p.start for p in found]
    for days in range(-partitions.AHEAD_DAYS, partitions.DEFAULT_KEEP_DAYS + 1):
        assert today - days * DAY in starts


async def test_processes_making_the_same_partitions_at_once(
    db: asyncpg.Connection, conns: list[asyncpg.Connection]
) -> None:
    later = datetime.now(UTC) + 100 * DAY
    made = await asyncio.gather(*(partitions.create_ahead(c, later, 2) for c in conns))
    wanted = [day_name(d) for d in partitions.wanted_days(later, 2)]
    assert sorted(name for names_ in made for name in names_) == wanted
    assert (await names(db))[-len(wanted) :] == wanted
    assert await partitions.create_ahead(db, later, 2) == []


async def test_a_write_for_a_day_without_a_partition_makes_it(db: asyncpg.Connection) -> None:
    workspace_id, server_id = await server(db)
    far = floor_day(datetime.now(UTC)) + 40 * DAY
    assert day_name(far) not in await names(db)
    calls = [call(workspace_id, server_id, far + timedelta(hours=h)) for h in range(3)]
    calls.append(call(workspace_id, server_id, datetime.now(UTC)))
    assert await tool_calls_db.write_batch(db, calls) == 4
    assert day_name(far) in await names(db)
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 4
    # A row refused for what it holds is still refused.
    with pytest.raises(asyncpg.CheckViolationError):
        await tool_calls_db.write_batch(db, [call(workspace_id, server_id, far)._replace(
            status="maybe")])  # fmt: skip


async def test_one_process_drops_the_expired_days(
    db: asyncpg.Connection, conns: list[asyncpg.Connection]
) -> None:
    workspace_id, server_id = await server(db)
    now = floor_day(datetime.now(UTC)) + 12 * HOUR
    old = [call(workspace_id, server_id, now - d * DAY) for d in (25, 12, 11, 10, 9, 1, 0)]
    await tool_calls_db.write_batch(db, old)
    before = await partitions.partitions(db)
    expired = [p.name for p in before if p.end <= now - 10 * DAY - GRACE]
    dropped = await asyncio.gather(*(partitions.drop_expired(c, now, 10) for c in conns))
    # One did it all (oldest first); the others found the lock taken, or nothing left.
    assert sorted(dropped, key=len) == [[], [], expired]
    assert await names(db) == [p.name for p in before if p.name not in expired]
    left = [r["created_at"] for r in await db.fetch("SELECT created_at FROM tool_calls")]
    assert sorted(left) == sorted(c.created_at for c in old if c.created_at >= now - 10 * DAY)
    assert len(left) == 4
    tables = await db.fetchval(
        "SELECT count(*) FROM pg_class WHERE relname = ANY($1::text[])", expired
    )
    assert tables == 0


async def test_a_detach_waits_for_old_readers_only_and_is_finished_later(
    db: asyncpg.Connection, conns: list[asyncpg.Connection]
) -> None:
    """DETACH ... CONCURRENTLY waits for the queries that began before it (they may still read
    the day); meanwhile new readers and writers go on. Cut short by its timeout, it is
    finished (FINALIZE) by the next round."""
    reader, dropper, other = conns
    workspace_id, server_id = await server(db)
    now = floor_day(datetime.now(UTC)) + 12 * HOUR
    await tool_calls_db.write_batch(db, [call(workspace_id, server_id, now - 20 * DAY)])
    doomed = day_name(floor_day(now - 20 * DAY))
    expired = [p.name for p in await partitions.partitions(db) if p.end <= now - 19 * DAY - GRACE]
    assert doomed in expired

    old_reader = reader.transaction(isolation="repeatable_read")
    await old_reader.start()
    assert await reader.fetchval("SELECT count(*) FROM tool_calls") == 1
    detach = asyncio.create_task(partitions.drop_expired(dropper, now, 19, detach_timeout=30))
    waiting = """
    SELECT count(*) FROM pg_stat_activity
    WHERE query LIKE 'ALTER TABLE tool_calls DETACH PARTITION%' AND wait_event_type = 'Lock'
    """
    for _ in range(600):  # until the detach waits for the old reader (at most ~30 s)
        if await db.fetchval(waiting):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the detach never waited for the old reader")
    # New readers and writers are not held up by it.
    await tool_calls_db.write_batch(other, [call(workspace_id, server_id, now)])
    # Both calls: the detach is still at the oldest day (an empty one).
    assert await other.fetchval("SELECT count(*) FROM tool_calls") == 2
    assert not detach.done()
    await old_reader.commit()
    assert doomed in await detach

    # Cut short: the day stays, detach pending, until the next round finalizes it.
    await tool_calls_db.write_batch(db, [call(workspace_id, server_id, now - 18 * DAY)])
    expired = [p.name for p in await partitions.partitions(db) if p.end <= now - 17 * DAY - GRACE]
    assert expired == [day_name(floor_day(now - d * DAY)) for d in (19, 18)]
    pending = expired[0]
    old_reader = reader.transaction(isolation="repeatable_read")
    await old_reader.start()
    await reader.fetchval("SELECT count(*) FROM tool_calls")
    with pytest.raises(asyncpg.QueryCanceledError):
        await partitions.drop_expired(dropper, now, 17, detach_timeout=0.5)
    assert [p.detaching for p in await partitions.partitions(db) if p.name == pending] == [True]
    await old_reader.commit()
    # The session's own statement timeout is back.
    assert await dropper.fetchval("SHOW statement_timeout") == "0"
    assert await partitions.drop_expired(dropper, now, 17) == expired
    assert not set(expired) & set(await names(db))
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 1
