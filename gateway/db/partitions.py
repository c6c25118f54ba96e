"""The partitions of tool_calls, one per UTC day: made ahead of need, dropped whole once expired.

Every partition's name says what it holds: tool_calls_YYYYMMDD the calls of that UTC day, and
tool_calls_before_YYYYMMDD (only from migration 0005, the table as it was) everything before
that day. No DEFAULT partition: it would forbid DETACH ... CONCURRENTLY (and ordered scans), so
a day must have its partition before a call of that day is written. create_ahead() makes them
from the oldest day ingestion still accepts through AHEAD_DAYS after today: at every start
(apply_schema) and hourly (workers/retention.py), so a gateway down across midnight, or a
worker late by a day, still finds today's. drop_expired() detaches expired days CONCURRENTLY
(readers and writers are never blocked, unlike DELETE or a plain DETACH) and drops them: the
cost of a day is the same whatever it held.

Each runs under an advisory lock of its own, so gateway processes doing this at once neither
collide on the same DDL nor fail it: a second creator waits and then finds the partitions
there, a second dropper skips the round. rollups.rebuild() holds the droppers' lock (shared)
while it reads, so no day it counts disappears under it; creating never waits for a rebuild.
A write that still finds no partition for its day (every process runs with the background
workers off, or the retention loop failed for days) makes it there and then: create_days(),
from tool_calls.write_batch().
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gateway.db.types import Connection

log = logging.getLogger(__name__)

DAY = timedelta(days=1)
# Days after today that already have their partition: the proxy writes created_at = now, and
# ingestion accepts up to FUTURE_SLACK ahead, so two spare days leave a worker that stopped
# running maintenance a day and more before any write has nowhere to go.
AHEAD_DAYS = 2
# How far ahead of the clock an ingested created_at may be (a client's clock running fast):
# well inside tomorrow's partition, which always exists.
FUTURE_SLACK = timedelta(hours=1)
# A day is dropped only this long after its last instant left the retention: a call accepted
# at the edge of the retention (created_at just old enough) is committed long before its
# partition can go, even by a batch that was retried for a while.
GRACE = timedelta(hours=1)
# Settings.tool_call_retention_days' default, for callers without settings (the template
# database of the tests, `mcp-gateway migrate`).
DEFAULT_KEEP_DAYS = 30
# The longest a DETACH ... CONCURRENTLY may wait for queries that began before it (they still
# read the partition); one cut short is finished (FINALIZE) in the next round.
DETACH_TIMEOUT_SECONDS = 300.0

# Any constants, the same in every gateway process; next to schema.py's migration lock.
# LOCK_KEY: dropping (and rebuilding the rollups, shared); CREATE_LOCK_KEY: creating.
LOCK_KEY = 0x6D637069
CREATE_LOCK_KEY = 0x6D63706A
_LOCK = "SELECT pg_advisory_lock($1)"
_TRY_LOCK = "SELECT pg_try_advisory_lock($1)"
_UNLOCK = "SELECT pg_advisory_unlock($1)"

_NAME = re.compile(r"^tool_calls_(before_)?(\d{8})$")

# The tables named like partitions in tool_calls' schema, attached or not: one left behind
# detached (a DROP that failed) or created but not attached (an ATTACH that failed) is seen too.
_PARTITIONS = r"""
SELECT c.relname::text AS name, i.inhrelid IS NOT NULL AS attached,
       coalesce(i.inhdetachpending, false) AS detaching
FROM pg_class AS c
LEFT JOIN pg_inherits AS i ON i.inhrelid = c.oid AND i.inhparent = 'tool_calls'::regclass
WHERE c.relkind = 'r'
  AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'tool_calls'::regclass)
  AND c.relname::text ~ '^tool_calls_(before_)?[0-9]{8}$'
"""


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    # None: from the beginning of time (the table migration 0005 attached).
    start: datetime | None
    end: datetime
    attached: bool
    # DETACH ... CONCURRENTLY began and was cut short: FINALIZE ends it.
    detaching: bool

    def covers(self, day: datetime) -> bool:
        return (self.start is None or self.start <= day) and day < self.end


def floor_day(moment: datetime) -> datetime:
    """The start of the UTC day holding `moment`."""
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def day_name(day: datetime) -> str:
    return f"tool_calls_{day:%Y%m%d}"


def _parse(name: str, attached: bool, detaching: bool) -> Partition:
    match = _NAME.match(name)
    assert match is not None, name
    before, digits = match.groups()
    day = datetime.strptime(digits, "%Y%m%d").replace(tzinfo=UTC)
    if before:
        return Partition(name, None, day, attached, detaching)
    return Partition(name, day, day + DAY, attached, detaching)


async def partitions(conn: Connection) -> list[Partition]:
    """Every table named like a partition of tool_calls, oldest first."""
    rows = await conn.fetch(_PARTITIONS)
    found = [_parse(row["name"], row["attached"], row["detaching"]) for row in rows]
    return sorted(found, key=lambda p: (p.end, p.start is not None))


def wanted_days(now: datetime, keep_days: int, ahead_days: int = AHEAD_DAYS) -> list[datetime]:
    """The days that must have a partition: from the one holding the oldest created_at that
    ingestion accepts (now - keep_days) through `ahead_days` after today."""
    first = floor_day(now - keep_days * DAY)
    count = (floor_day(now) - first) // DAY + ahead_days + 1
    return [first + i * DAY for i in range(count)]


def _missing(found: Iterable[Partition], days: list[datetime]) -> list[datetime]:
    # A day whose detach is pending counts as covered: it is expired (see drop_expired), and
    # its range still belongs to the partition until the detach finishes.
    usable = [p for p in found if p.attached]
    return [day for day in days if not any(p.covers(day) for p in usable)]


async def create_ahead(
    conn: Connection, now: datetime, keep_days: int, ahead_days: int = AHEAD_DAYS
) -> list[str]:
    """Create the missing partitions of wanted_days(); returns their names. Nothing is locked
    when none is missing (the usual case: one catalog query)."""
    return await create_days(conn, wanted_days(now, keep_days, ahead_days))


async def create_days(conn: Connection, days: Iterable[datetime]) -> list[str]:
    """Create the partitions of those of `days` (starts of UTC days) that have none; returns
    their names."""
    days = sorted(set(days))
    if not _missing(await partitions(conn), days):
        return []
    await conn.execute(_LOCK, CREATE_LOCK_KEY)
    try:
        created = []
        # Again under the lock: another process may just have made them.
        for day in _missing(await partitions(conn), days):
            await _create(conn, day)
            created.append(day_name(day))
    finally:
        await conn.execute(_UNLOCK, CREATE_LOCK_KEY)
    if created:
        # Routine (a month of them on a first start, then one a day): not for the start-up log.
        log.debug("created %d tool_calls partitions: %s", len(created), ", ".join(created))
    return created


async def _create(conn: Connection, day: datetime) -> None:
    # CREATE TABLE ... PARTITION OF would hold an ACCESS EXCLUSIVE lock on tool_calls (every
    # reader and writer waits behind it, and it behind any long query); ATTACH PARTITION takes
    # only SHARE UPDATE EXCLUSIVE, which neither reads nor writes conflict with. The new table
    # is empty: nothing to scan, its indexes are made empty by the ATTACH. A table of that
    # name left unattached by an earlier failure is attached as it is.
    name = day_name(day)
    async with conn.transaction():
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {name} "
            "(LIKE tool_calls INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        await conn.execute(
            f"ALTER TABLE tool_calls ATTACH PARTITION {name} "
            f"FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + DAY).isoformat()}')"
        )


def expired(found: Iterable[Partition], now: datetime, keep_days: int) -> list[Partition]:
    """Partitions whose every row is older than the retention, by GRACE at least."""
    cutoff = now - keep_days * DAY - GRACE
    return [p for p in found if p.end <= cutoff]


async def drop_expired(
    conn: Connection,
    now: datetime,
    keep_days: int,
    *,
    detach_timeout: float = DETACH_TIMEOUT_SECONDS,
) -> list[str]:
    """Detach (CONCURRENTLY) and drop every expired partition, oldest first; returns their
    names. Skips the round when another process holds the lock. `conn` must not be in a
    transaction: DETACH ... CONCURRENTLY commits twice on its own."""
    if not expired(await partitions(conn), now, keep_days):
        return []
    if not await conn.fetchval(_TRY_LOCK, LOCK_KEY):
        return []
    dropped = []
    try:
        # The waits of a detach are for readers that began before it, not for writers; the
        # session's statement timeout (a pool's) would cut them short.
        await conn.execute(f"SET statement_timeout = {int(detach_timeout * 1000)}")
        for partition in expired(await partitions(conn), now, keep_days):
            if partition.detaching:
                detach = "FINALIZE"
            elif partition.attached:
                detach = "CONCURRENTLY"
            else:
                detach = None  # detached before, its DROP failed
            started = time.perf_counter()
            if detach is not None:
                await conn.execute(
                    f"ALTER TABLE tool_calls DETACH PARTITION {partition.name} {detach}",
                    timeout=detach_timeout + 5,
                )
            detached = time.perf_counter()
            # Nobody reads a detached table through tool_calls any more: the lock is free.
            await conn.execute(f"DROP TABLE {partition.name}")
            dropped.append(partition.name)
            log.info(
                "dropped tool_calls partition %s (detach %.0f ms, drop %.0f ms)",
                partition.name,
                (detached - started) * 1000,
                (time.perf_counter() - detached) * 1000,
            )
    finally:
        await conn.execute("RESET statement_timeout")
        await conn.execute(_UNLOCK, LOCK_KEY)
    return dropped


async def complete_since(conn: Connection) -> datetime | None:
    """The instant from which tool_calls still holds every call written (the start of its
    oldest partition); None when nothing was ever dropped (the table migration 0005 attached
    is still there). Rollups of earlier hours have no raw calls left to recompute them from."""
    usable = [p for p in await partitions(conn) if p.attached and not p.detaching]
    if not usable:
        raise RuntimeError("tool_calls has no partitions: apply the schema first")
    if any(p.start is None for p in usable):
        return None
    return min(p.start for p in usable if p.start is not None)
