"""The tool call log: a bounded in-memory queue of tool calls, flushed by COPY in batches.

CallLog.add() (the proxy) appends to a list and returns: it never awaits I/O. A background task
takes a batch FLUSH_SECONDS after rows came when someone waits for their commit (write()), else
GATHER_SECONDS after (nobody waits for the proxy's rows, and fewer, larger batches leave the proxy
more CPU), or as soon as BATCH_ROWS rows wait, and writes it in one transaction: COPY into
tool_calls plus the batch's rollups (gateway/db/tool_calls.py). Up to WRITERS batches are written at
once, each on its own connection, a second one only when someone waits for a commit or a full batch
is ready; the proxy's calls otherwise gather while a batch is in flight. A batch that fails is
retried after a backoff of its own (doubling up to a bound), and while the database is unreachable
all writing pauses for it; records carry their ids from the start and a retry skips ids already
stored, so an ambiguous commit never duplicates. The queue is bounded (max_rows, counting batches
being written or waiting for a retry): past the bound, add() drops the new record and counts it
(stats.dropped, and a warning at most every 10 s), and write() (POST /tool-calls, which answers only
after its rows are committed) refuses with 503, so nothing acknowledged is dropped. One workspace
may hold at most a share of the bound (workspace_rows), its rows not stored and the rows it reserved
together: the proxy reserves room for a request's calls before it forwards them (and refuses them
without room), add() never drops a reserved row, room for a row that will not come is given back
(release()), and write() refuses with 503, so one tenant's flood never fills the log the others
need. On shutdown the queue drains before the pool closes."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
from aiohttp import web

from gateway.background.tasks import report_death
from gateway.calllog.records import WORKSPACE_OF, ToolCall
from gateway.db import tool_calls as tool_calls_db
from gateway.db.unavailable import DATABASE_DOWN
from gateway.errors import ServiceUnavailable, ValidationFailed

log = logging.getLogger(__name__)

# Room reserved in the log for a workspace's calls not yet added: a one-item list (the rows),
# which the proxy hands back to add() so that no dictionary is looked up per call.
Reservation = list[int]
# Workspaces with a reservation before idle ones are dropped.
_RESERVATIONS_KEPT = 10_000
# How often the rows waiting are counted by workspace, while they are many.
_SHARES_SECONDS = 0.05


# -- the writer --------------------------------------------------------------------------------


@dataclass(slots=True)
class CallLogStats:
    """Counters since start (len(call_log) is what waits in memory now)."""

    written: int = 0
    # Rows not stored because their server was deleted before the flush (or already stored).
    skipped: int = 0
    # Rows lost because the queue was full (database unavailable for long), or still unwritten
    # when shutdown gave up waiting for the database.
    dropped: int = 0
    # Rows set aside because PostgreSQL refused them even in a part of their own (bad data);
    # each logged once.
    rejected: int = 0
    batches: int = 0
    failures: int = 0


# The rows of one write() as [start, end) in its batch, and the future its caller awaits.
_Waiter = tuple[int, int, "asyncio.Future[None]"]

_REFUSED = "body: PostgreSQL refused these tool calls; none of them was stored"


def _shifted(waiters: list[_Waiter], removed: int) -> list[_Waiter]:
    """Waiters after `removed` rows before them were taken out."""
    return [(start - removed, end - removed, future) for start, end, future in waiters]


def _units(size: int, waiters: list[_Waiter]) -> list[tuple[int, int]]:
    """A batch of `size` rows as [start, end) units: each write()'s rows, each add()'s row."""
    units: list[tuple[int, int]] = []
    position = 0
    for start, end, _ in sorted(waiters, key=lambda waiter: waiter[0]):
        units.extend((i, i + 1) for i in range(position, start))
        if end > start:
            units.append((start, end))
        position = max(position, end)
    units.extend((i, i + 1) for i in range(position, size))
    return units


def no_room() -> ServiceUnavailable:
    """Calls refused because the log has no room for them now: forwarded, they would run
    unlogged (the log is full, or their workspace holds its share of it)."""
    return ServiceUnavailable(
        "the tool call log has no room for this workspace's calls now (database slow or "
        "unavailable?); retry shortly",
        headers={"Retry-After": "1"},
    )


class RowsRejected(ValidationFailed):
    """The rows of a write() could not be stored (PostgreSQL refused them); none of them was."""


class _Unfinished(Exception):
    """A batch being written in parts met a database failure: what is left of it (neither
    written nor set aside) goes back in line as a batch of its own."""

    def __init__(self, batch: list[ToolCall], waiters: list[_Waiter], cause: BaseException):
        super().__init__(str(cause))
        self.batch = batch
        self.waiters = waiters
        self.cause = cause


@dataclass(slots=True, eq=False)
class _Retry:
    """A batch that failed, waiting until `due` for its next attempt."""

    batch: list[ToolCall]
    waiters: list[_Waiter]
    # Seconds waited before this attempt: doubled at each failure of this batch.
    backoff: float
    due: float


_FIRST_BACKOFF = 0.05

# The database is out of reach: every batch would fail, so all writing pauses for the backoff.
# Failures of the moment, not of the rows: the same batch is tried again after a backoff.
# Anything else is taken to be about the rows, and the batch is written in parts.
_TRANSIENT: tuple[type[BaseException], ...] = (
    *DATABASE_DOWN,
    asyncpg.exceptions.TransactionRollbackError,  # deadlock, serialization
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.QueryCanceledError,  # statement timeout, or cancelled by an operator
)


class CallLog:
    """The bounded queue of tool calls and its writer task."""

    FLUSH_SECONDS = 0.005
    # Each batch costs this process about 0.45 ms of CPU whatever its size, plus about 2 µs a
    # row (bench/README.md): at 1,500 calls a second, gathering 5 ms makes batches of a dozen
    # rows, which cost the proxy some 40 µs of CPU a call; 50 ms, about 8 µs.
    GATHER_SECONDS = 0.05
    BATCH_ROWS = 5000
    # Batches written at once, each on its own connection: while one waits for its commit to
    # reach the disk, the next is already being copied. More would only queue on the rollups.
    WRITERS = 2

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        max_rows: int = 200_000,
        flush_seconds: float = FLUSH_SECONDS,
        gather_seconds: float = GATHER_SECONDS,
        batch_rows: int = BATCH_ROWS,
        writers: int = WRITERS,
        max_backoff_seconds: float = 5.0,
        commit_timeout: float | None = None,
        workspace_share: float = 0.25,
    ) -> None:
        self._pool = pool
        # How long write() waits for its commit before taking its rows back (503); None: as
        # long as it takes.
        self._commit_timeout = commit_timeout
        self.max_rows = max_rows
        self._flush_seconds = flush_seconds
        self._gather_seconds = max(gather_seconds, flush_seconds)
        self._batch_rows = batch_rows
        self._writers = writers
        self._max_backoff = max_backoff_seconds
        self._rows: list[ToolCall] = []
        # The rows of each write(), as [start, end) in _rows, and its future: set once committed.
        self._waiters: list[_Waiter] = []
        # Batches that failed and wait for their retry, oldest first.
        self._retries: list[_Retry] = []
        # Rows taken from the queue and not yet stored (being written or waiting for a retry):
        # counted in the bound.
        self._held = 0
        # The batches being written, by task: a task cancelled (even before it ran) fails them.
        self._writing: dict[asyncio.Task[None], tuple[list[ToolCall], list[_Waiter]]] = {}
        # Until then nothing is written: the database was unreachable.
        self._resume_at = 0.0
        # Set by producers, by a finished write and by close(): the writer looks again.
        self._wakeup = asyncio.Event()
        # Cuts the linger short: a full batch is waiting, or shutdown, or (while gathering the
        # proxy's rows) a write() whose caller waits.
        self._hurry = asyncio.Event()
        self._gathering = False
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        # The writer is gone (close() returned): anything added now is dropped and counted.
        self._closed = False
        self.stats = CallLogStats()
        self._last_drop_warning = 0.0
        # One workspace may hold at most `workspace_rows` of the bound, so a tenant's flood
        # of calls (or a long database outage it fills) leaves room for everyone else's. What
        # counts is its rows not yet stored and the rows it reserved: the proxy reserves room
        # for a request's calls before forwarding it, and adds their rows when the reply ends.
        self.workspace_rows = max(1, int(max_rows * workspace_share))
        # Reserved rows by workspace (one-item lists the proxy hands back to add()), and in all.
        self._reservations: dict[uuid.UUID, list[int]] = {}
        self._reserved = 0
        # While fewer rows wait and are reserved than one share, nobody can be over its share
        # and nothing is counted (every proxied call asks). Past that, the rows not yet stored
        # are counted by workspace at most every _SHARES_SECONDS, and rows added meanwhile are
        # added to that count (`_counting`).
        self._shares: Counter[uuid.UUID] = Counter()
        self._shares_at = -_SHARES_SECONDS
        self._counting = False

    # -- producers -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._rows) + self._held

    def reserve(self, workspace_id: uuid.UUID, count: int) -> Reservation | None:
        """Room for `count` calls of the workspace, to add() later with the reservation; None
        when the log has none: past its bound, or past the workspace's share of it. The proxy
        asks before it forwards calls, and refuses them without room."""
        reservation = self._reservations.get(workspace_id) or self._new_reservation(workspace_id)
        waiting = len(self._rows) + self._held + self._reserved + count
        if waiting > self.workspace_rows:  # else, the usual case, no share can be full
            if waiting > self.max_rows or self._closed:
                return None
            if self._unstored(workspace_id) + reservation[0] + count > self.workspace_rows:
                return None
        elif self._counting:
            self._counting = False
        elif self._closed:
            return None
        reservation[0] += count
        self._reserved += count
        return reservation

    def release(self, reservation: Reservation, count: int = 1) -> None:
        """Give back room reserved for `count` calls that will not be added (a reply that was
        no call's end, such as an interim answer), so the bound counts only rows to come."""
        reservation[0] -= count
        self._reserved -= count

    def _give_back(self, taken: list[tuple[Reservation, int]]) -> None:
        for reservation, count in taken:
            self.release(reservation, count)

    def _new_reservation(self, workspace_id: uuid.UUID) -> Reservation:
        if len(self._reservations) >= _RESERVATIONS_KEPT:  # drop the idle ones
            for idle in [key for key, held in self._reservations.items() if not held[0]]:
                del self._reservations[idle]
        reservation = self._reservations[workspace_id] = [0]
        return reservation

    def _unstored(self, workspace_id: uuid.UUID) -> int:
        """The workspace's rows not yet stored (counted at most every _SHARES_SECONDS)."""
        now = time.monotonic()
        if not self._counting or now - self._shares_at >= _SHARES_SECONDS:
            unstored = [self._rows, *(batch for batch, _ in self._writing.values())]
            unstored += [retry.batch for retry in self._retries]
            self._shares = Counter(map(WORKSPACE_OF, itertools.chain.from_iterable(unstored)))
            self._shares_at = now
            self._counting = True
        return self._shares[workspace_id]

    def add(self, call: ToolCall, reservation: Reservation | None = None) -> None:
        """Queue one call; never waits. A call with a reservation is never dropped (it turns
        into its row); one without is dropped and counted when the queue is full."""
        if reservation is not None:
            reservation[0] -= 1
            self._reserved -= 1
            if self._counting:
                self._shares[call.workspace_id] += 1
        elif len(self._rows) + self._held >= self.max_rows:
            self._drop(1)
            return
        if self._closed:
            self._drop(1)
            return
        rows = self._rows
        rows.append(call)
        # The writer sleeps only while nothing is queued, or while a batch is in flight and the
        # next is still gathering: it needs waking for the first row and for a full batch only.
        if len(rows) == 1:
            self._wakeup.set()
        elif len(rows) >= self._batch_rows:
            self._hurry.set()
            self._wakeup.set()

    async def write(
        self, calls: Sequence[ToolCall], reservation: Reservation | None = None
    ) -> None:
        """Queue calls and return once they are committed (POST /tool-calls, the playground).

        Raises ServiceUnavailable at once when they do not fit (the caller should retry), and
        RowsRejected when PostgreSQL refused some of them. With a reservation (of one
        workspace's calls, taken before the calls were made) they always fit.
        """
        if self._closing:
            raise ServiceUnavailable("the gateway is shutting down", headers={"Retry-After": "1"})
        taken: list[tuple[Reservation, int]] = []
        if reservation is not None:
            taken.append((reservation, len(calls)))
        else:
            for workspace_id, count in Counter(map(WORKSPACE_OF, calls)).items():
                held = self.reserve(workspace_id, count)
                if held is None:
                    self._give_back(taken)
                    raise no_room()
                taken.append((held, count))
        self._give_back(taken)  # they turn into rows now
        if self._counting:
            self._shares.update(map(WORKSPACE_OF, calls))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        start = len(self._rows)
        self._rows.extend(calls)
        self._waiters.append((start, len(self._rows), future))
        self._wakeup.set()
        if self._gathering or len(self._rows) >= self._batch_rows:
            self._hurry.set()
        await self._committed(future)

    async def _committed(self, future: asyncio.Future[None]) -> None:
        """Wait for the commit, at most commit_timeout: then the rows are taken back and the
        caller told so (503), unless a batch attempt is writing them. That attempt ends within
        the database's own timeouts and decides: committed, or back in line and taken back. So
        a 503 is never followed by the rows appearing later (a client would retry them)."""
        try:
            await asyncio.wait_for(asyncio.shield(future), self._commit_timeout)
            return
        except TimeoutError:
            pass
        while not future.done():
            if self._withdraw(future):
                raise ServiceUnavailable(
                    "the database did not commit the tool calls in time; none was stored, "
                    "retry them",
                    headers={"Retry-After": "1"},
                )
            await asyncio.wait({future}, timeout=0.05)  # the attempt writing them ends
        future.result()

    def _withdraw(self, future: asyncio.Future[None]) -> bool:
        """Take a write()'s rows out of the queue or of a batch waiting for its retry; False
        when a batch attempt has them in flight."""
        for index, (start, end, waiting) in enumerate(self._waiters):
            if waiting is future:
                del self._rows[start:end]
                self._waiters[index:] = _shifted(self._waiters[index + 1 :], end - start)
                return True
        for retry in self._retries:
            for index, (start, end, waiting) in enumerate(retry.waiters):
                if waiting is future:
                    del retry.batch[start:end]
                    retry.waiters[index:] = _shifted(retry.waiters[index + 1 :], end - start)
                    self._held -= end - start
                    if not retry.batch:
                        self._retries.remove(retry)
                    return True
        return False

    def _drop(self, count: int) -> None:
        self.stats.dropped += count
        now = time.monotonic()
        if now - self._last_drop_warning >= 10.0:
            self._last_drop_warning = now
            log.warning(
                "tool call log full or closed (%d rows pending): dropped %d calls so far",
                len(self),
                self.stats.dropped,
            )

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="call-log-writer")
        self._task.add_done_callback(self._report_death)

    def _report_death(self, task: asyncio.Task[None]) -> None:
        # Returning is how the writer ends once close() has drained it: only a death is news.
        if not (self._closing and not task.cancelled() and task.exception() is None):
            report_death(task)

    async def close(self, drain_seconds: float = 20.0) -> None:
        """Write everything queued (retrying while the database is down, for up to
        drain_seconds)."""
        self._closing = True
        self._wakeup.set()
        self._hurry.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), drain_seconds)
            except TimeoutError:
                tasks = [self._task, *self._writing]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                lost = len(self)
                self._fail_waiters(ServiceUnavailable("the gateway shut down before storing"))
                self.stats.dropped += lost
                log.error("shutting down with %d tool calls not written (database down)", lost)
        self._closed = True

    # -- the writer task -------------------------------------------------------------------

    async def _run(self) -> None:
        lingered = False
        while True:
            now = time.monotonic()
            if self._resume_at > now:  # backing off: the database was unreachable
                await asyncio.sleep(self._resume_at - now)
                continue
            due = next((r for r in self._retries if r.due <= now), None)
            busy = len(self._writing)
            if (
                busy >= self._writers
                or (due is None and not self._rows)
                or (busy and not self._parallel_batch_pays(due))
            ):
                if self._closing and not self._writing and not self._retries and not self._rows:
                    return
                # Until a write ends or rows come (the wakeup), or the next retry is due.
                next_due = min((r.due for r in self._retries), default=None)
                full = busy >= self._writers
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._wakeup.wait(), None if full or next_due is None else next_due - now
                    )
                continue
            short = due is None and len(self._rows) < self._batch_rows and not self._closing
            if short and not lingered:
                # Linger a moment so a burst becomes one batch, then look again: a batch may
                # have failed meanwhile. Longer when nobody waits for these rows' commit.
                lingered = True
                self._hurry.clear()
                self._gathering = not self._waiters
                linger = self._gather_seconds if self._gathering else self._flush_seconds
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), linger)
                self._gathering = False
                continue
            lingered = False
            batch, waiters = self._take(due)
            self._held += len(batch)
            task = asyncio.create_task(
                self._write_batch(batch, waiters, None if due is None else due.backoff)
            )
            self._writing[task] = (batch, waiters)
            task.add_done_callback(self._written)

    def _parallel_batch_pays(self, due: _Retry | None) -> bool:
        """Whether to start a batch while another is in flight: when someone waits for a commit
        (write()), a full batch is ready, a retry is due or shutdown drains. The proxy's stream
        of add()s is gathered by the batch in flight instead: each batch costs several round
        trips, whatever its size, so fewer, larger batches leave the hot path more CPU. A batch
        stuck on a lock thus holds back at most one full batch of proxied calls."""
        return (
            bool(self._waiters)
            or len(self._rows) >= self._batch_rows
            or due is not None
            or self._closing
        )

    def _written(self, task: asyncio.Task[None]) -> None:
        batch, waiters = self._writing.pop(task)
        if task.cancelled():  # shutdown gave up on it, maybe before it even started
            self._held -= len(batch)
            for _, _, future in waiters:
                if not future.done():
                    future.set_exception(ServiceUnavailable("the gateway shut down before storing"))
        self._wakeup.set()

    async def _write_batch(
        self, batch: list[ToolCall], waiters: list[_Waiter], backoff: float | None
    ) -> None:
        """Write one batch (`backoff`: it failed before); a failed one goes back in line for a
        retry, after a backoff of its own."""
        try:
            await self._write(batch, waiters, retry=backoff is not None)
        except _Unfinished as exc:
            self._held -= len(batch) - len(exc.batch)
            delay = self._failed(
                exc.batch, exc.waiters, backoff, pause_all=isinstance(exc.cause, DATABASE_DOWN)
            )
            log.warning(
                "cannot write %d tool calls (%s: %s); retrying in %.2f s",
                len(exc.batch),
                type(exc.cause).__name__,
                exc.cause,
                delay,
            )
        except _TRANSIENT as exc:
            delay = self._failed(batch, waiters, backoff, pause_all=isinstance(exc, DATABASE_DOWN))
            log.warning(
                "cannot write %d tool calls (%s: %s); retrying in %.2f s",
                len(batch),
                type(exc).__name__,
                exc,
                delay,
            )
        else:
            self._held -= len(batch)

    def _failed(
        self,
        batch: list[ToolCall],
        waiters: list[_Waiter],
        backoff: float | None,
        *,
        pause_all: bool,
    ) -> float:
        """Put a failed batch in line for a retry (still held, counted in the bound, until it
        succeeds); returns its delay."""
        self.stats.failures += 1
        delay = _FIRST_BACKOFF if backoff is None else min(backoff * 2, self._max_backoff)
        due = time.monotonic() + delay
        self._retries.append(_Retry(batch, waiters, delay, due))
        if pause_all:
            self._resume_at = max(self._resume_at, due)
        return delay

    def _take(self, retry: _Retry | None) -> tuple[list[ToolCall], list[_Waiter]]:
        """The next batch: a failed batch (as it was), else up to batch_rows new rows."""
        if retry is not None:
            self._retries.remove(retry)
            self._held -= len(retry.batch)  # held again by the caller, as a new write
            return retry.batch, retry.waiters
        if len(self._rows) <= self._batch_rows:
            batch, self._rows = self._rows, []
            waiters, self._waiters = self._waiters, []
            return batch, waiters
        cut = self._batch_rows
        for start, end, _ in self._waiters:
            if start < cut < end:
                # Never split the rows of one write(): its 201 means all of them are stored.
                cut = start if start > 0 else end
                break
        batch, self._rows = self._rows[:cut], self._rows[cut:]
        waiters = [w for w in self._waiters if w[1] <= cut]
        self._waiters = [(s - cut, e - cut, f) for s, e, f in self._waiters if e > cut]
        return batch, waiters

    async def _write(self, batch: list[ToolCall], waiters: list[_Waiter], *, retry: bool) -> None:
        # A connection per batch rather than one held between batches: the pool then replaces
        # connections lost in a database restart, and closing the pool never waits on ours.
        async with self._pool.acquire(timeout=10) as conn:
            try:
                inserted = await tool_calls_db.write_batch(conn, batch, retry=retry)
            except _TRANSIENT:
                raise
            except Exception as exc:
                # About the rows, not the moment: retrying the same batch would fail forever
                # and hold back every tenant's calls in it.
                log.warning(
                    "a batch of %d tool calls was refused (%s: %s); writing it in parts",
                    len(batch),
                    type(exc).__name__,
                    exc,
                )
                await self._write_apart(conn, batch, waiters)
                return
        self._count_batch(len(batch), inserted)
        for _, _, future in waiters:
            if not future.done():
                future.set_result(None)

    def _count_batch(self, size: int, inserted: int) -> None:
        self.stats.batches += 1
        self.stats.written += inserted
        self.stats.skipped += size - inserted

    async def _write_apart(
        self, conn: asyncpg.pool.PoolConnectionProxy, batch: list[ToolCall], waiters: list[_Waiter]
    ) -> None:
        """Write a refused batch by halves, and halves of the halves that fail, until every
        part is written or is one unit PostgreSQL still refuses: that is set aside (logged,
        counted, never retried). A unit is one add()'s row or all the rows of one write(),
        whose answer covers them all. One bad row among n costs about 2·log2(n) attempts."""
        units = _units(len(batch), waiters)
        refused: set[tuple[int, int]] = set()
        parts = [units]
        while parts:
            part = parts.pop()
            rows = [row for start, end in part for row in batch[start:end]]
            try:
                # retry: the batch may be a retry of one whose commit went unheard.
                inserted = await tool_calls_db.write_batch(conn, rows, retry=True)
            except _TRANSIENT as exc:
                left = [unit for remaining in (part, *parts) for unit in remaining]
                raise self._unfinished(batch, waiters, left, exc) from exc
            except Exception as exc:
                if len(part) == 1:
                    refused.add(part[0])
                    self._set_aside(batch, part[0], exc)
                else:
                    middle = len(part) // 2
                    parts += (part[middle:], part[:middle])  # the first half next
                continue
            self._count_batch(len(rows), inserted)
        for start, end, future in waiters:
            if not future.done():
                if (start, end) in refused:
                    future.set_exception(RowsRejected(_REFUSED))
                else:
                    future.set_result(None)

    def _set_aside(self, batch: list[ToolCall], unit: tuple[int, int], exc: Exception) -> None:
        start, end = unit
        first = batch[start]
        self.stats.rejected += end - start
        log.error(
            "%d tool call(s) of workspace %s set aside, PostgreSQL cannot store them "
            "(%s: %s); the first: %.500r",
            end - start,
            first.workspace_id,
            type(exc).__name__,
            exc,
            first,
            extra={"workspace_id": str(first.workspace_id), "tool_call_id": str(first.id)},
        )

    @staticmethod
    def _unfinished(
        batch: list[ToolCall],
        waiters: list[_Waiter],
        left: list[tuple[int, int]],
        cause: BaseException,
    ) -> _Unfinished:
        """What is left of a batch written in parts, as a batch of its own; the waiters of
        units already written are answered."""
        rest: list[ToolCall] = []
        moved: dict[tuple[int, int], tuple[int, int]] = {}
        for start, end in sorted(left):
            moved[(start, end)] = (len(rest), len(rest) + end - start)
            rest.extend(batch[start:end])
        rest_waiters: list[_Waiter] = []
        for start, end, future in waiters:
            if future.done():
                continue
            if (start, end) in moved:
                rest_waiters.append((*moved[(start, end)], future))
            else:
                future.set_result(None)
        return _Unfinished(rest, rest_waiters, cause)

    def _fail_waiters(self, exc: Exception) -> None:
        """Give up on everything still queued (shutdown with the database down)."""
        retry_waiters = [waiter for retry in self._retries for waiter in retry.waiters]
        for _, _, future in [*self._waiters, *retry_waiters]:
            if not future.done():
                future.set_exception(exc)
        self._held -= sum(len(retry.batch) for retry in self._retries)
        self._rows, self._waiters, self._retries = [], [], []


# The tool call log: add() from the hot path, write() to wait for the commit.
CALL_LOG: web.AppKey[CallLog] = web.AppKey("call_log")
