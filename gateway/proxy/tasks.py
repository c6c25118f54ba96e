"""Calls that became tasks, logged once, when they end.

Under the tasks extension (2026-07-28; 2025-11-25 had tasks too) a server may answer a
`tools/call` with a task handle (`resultType: "task"`) instead of its result; the client then
polls `tasks/get` (or asks `tasks/result`, 2025-11-25) until a reply says the task completed
(the tool's result inlined), failed or was cancelled, or it cancels the task (`tasks/cancel`).
The call ends with that reply, which may reach any gateway process (`serve --workers N`, or
several machines): what the call was (tool, caller, start, the toolset it came through) is
kept in PostgreSQL in between, one row of pending_tasks per task, never in one process's
memory. A toolset finds there which of its members holds a task its client asks about.

- A handle: before it is passed on (so that no poll can overtake it), the task is stored
  (one INSERT, awaited). The call has no row yet; the room reserved for it in the call log
  goes back. Stored nowhere (the database is down, the workspace follows MAX_FOLLOWED tasks
  already, a task id that cannot be a key), the call is logged at once, an error saying so.
  Stored, the task is the call's whatever happens to the handle's delivery: a caller that
  hangs up just then polls nothing, and the call is logged when the task expires.
- A reply about a task that ends it, once passed on: the task is taken out (one DELETE) and
  the call logged, as the reply says (success, the tool's `isError` text, the JSON-RPC error
  of a failed task, a cancellation). The DELETE decides between racing replies: one row.
  Its duration runs from the tools/call's arrival to that reply, polling included.
- A task no such reply ended (the client gave up, or learned the end from notifications
  only) is logged by the retention loop once it expired (its TTL, within bounds), an error
  saying so, with no duration.

Ordinary calls pay nothing for this: a reply is judged a handle while it is read anyway
(gateway/proxy/replies.py), and only handles and the replies to task requests reach the
database. Each database step runs as a job of its own, awaited by the request that needs it
but finished (and its row or room accounted for) even when that request is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import asyncpg
from aiohttp import web

from gateway.calllog.records import ToolCall, new_call_id
from gateway.calllog.writer import CALL_LOG, CallLog, Reservation
from gateway.db import pending_tasks as pending_tasks_db
from gateway.db.pending_tasks import PendingTask
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.keys import POOL
from gateway.proxy.requests import ToolCallSeen
from gateway.upstreams.servers import Upstream

log = logging.getLogger(__name__)

# Tasks one workspace may have followed at once: past it, a call that becomes a task is
# logged at once (its end unknown), so one tenant's upstream cannot grow the table at will.
MAX_FOLLOWED: Final = 10_000
# Longer task ids are not kept (a key of PostgreSQL's index must fit in 2,704 bytes).
MAX_TASK_ID: Final = 500
# How long a task is followed: its TTL (the server may forget it then), within these bounds;
# a handle without a TTL (or an unlimited one) gets the default.
FOLLOW_DEFAULT: Final = timedelta(days=1)
FOLLOW_AT_LEAST: Final = timedelta(hours=1)
FOLLOW_AT_MOST: Final = timedelta(days=7)

EXPIRED: Final = (
    "task {task_id}: no reply ending it passed through the gateway before it expired (its "
    "end is not known; a client may learn it another way)"
)
_UNFOLLOWED = "the call became task {task_id}, whose end the gateway cannot follow: {reason}"


class TaskFollower:
    """The proxy's side of calls that became tasks; its jobs finish before shutdown goes on."""

    def __init__(self, pool: asyncpg.Pool, call_log: CallLog) -> None:
        self._pool = pool
        self._call_log = call_log
        self._jobs: set[asyncio.Task[None]] = set()

    def follow(
        self,
        upstream: Upstream,
        handles: Sequence[ToolCallSeen],
        reservation: Reservation,
        caller_agent: str | None,
        started: float,
        toolset_id: uuid.UUID | None = None,
    ) -> asyncio.Task[None]:
        """Store the tasks `handles` turned their calls into; the job returned ends once they
        are (the proxy waits for it before passing the handles on). Each call's room in the
        log is the job's: given back, or its row when the task cannot be followed. A task
        keeps the toolset its call came through (`toolset_id`), for its row and for the
        toolset's requests about it."""
        for call in handles:
            call.handed = True
        now = datetime.now(UTC)
        started_at = now - timedelta(seconds=time.perf_counter() - started)
        calls = list(handles)
        return self._start(
            self._follow(upstream, calls, reservation, caller_agent, started_at, now, toolset_id)
        )

    def settle(
        self,
        upstream: Upstream,
        ended: Sequence[ToolCallSeen],
        reservation: Reservation,
        size: int,
    ) -> None:
        """Log the calls whose tasks the replies to `ended` (requests about tasks) ended,
        once each; the room reserved for each goes back where no call is logged."""
        for entry in ended:
            entry.handed = True
        self._start(self._settle(upstream, list(ended), reservation, size, datetime.now(UTC)))

    @property
    def busy(self) -> bool:
        """Jobs are under way."""
        return bool(self._jobs)

    async def close(self) -> None:
        """Wait for the jobs under way (each is one short statement)."""
        while self._jobs:
            await asyncio.gather(*self._jobs, return_exceptions=True)

    def _start(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        job = asyncio.create_task(work)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)
        return job

    async def _follow(
        self,
        upstream: Upstream,
        handles: list[ToolCallSeen],
        reservation: Reservation,
        caller_agent: str | None,
        started_at: datetime,
        now: datetime,
        toolset_id: uuid.UUID | None,
    ) -> None:
        for call in handles:
            task_id = call.task_id or ""
            try:
                reason = await self._store(
                    upstream, call, caller_agent, started_at, now, toolset_id
                )
            except DATABASE_ERRORS as exc:
                log.warning("cannot follow task %.100r: %s: %s", task_id, type(exc).__name__, exc)
                reason = f"the database did not take it ({type(exc).__name__})"
            except Exception:  # its row is accounted for whatever happened
                log.exception("cannot follow task %.100r", task_id)
                reason = "the gateway failed to store it"
            if reason is None:
                self._call_log.release(reservation)
                continue
            error = _UNFOLLOWED.format(task_id=_shown(task_id), reason=reason)
            row = _row(
                upstream.workspace_id, upstream.id, call.name, caller_agent, "error", toolset_id
            )
            duration_ms = round((now - started_at).total_seconds() * 1000)
            self._call_log.add(
                row._replace(duration_ms=duration_ms, error_message=error, created_at=now),
                reservation,
            )

    async def _store(
        self,
        upstream: Upstream,
        call: ToolCallSeen,
        caller_agent: str | None,
        started_at: datetime,
        now: datetime,
        toolset_id: uuid.UUID | None,
    ) -> str | None:
        """Follow one call's task; why it cannot be, or None."""
        task_id = call.task_id or ""
        if not _usable(task_id):
            return f"task ids over {MAX_TASK_ID} characters, or holding NUL, are not kept"
        task = PendingTask(
            upstream.id,
            task_id,
            upstream.workspace_id,
            call.name,
            caller_agent,
            started_at,
            now + _followed_for(call.ttl_ms),
            toolset_id,
        )
        room, added = await pending_tasks_db.follow(self._pool, task, MAX_FOLLOWED)
        if not room:
            return f"its workspace follows {MAX_FOLLOWED:,} tasks already"
        if not added:
            return "the server named a task that is followed already"
        return None

    async def _settle(
        self,
        upstream: Upstream,
        ended: list[ToolCallSeen],
        reservation: Reservation,
        size: int,
        ended_at: datetime,
    ) -> None:
        for entry in ended:
            task_id = entry.task_id or ""
            pending = None
            if _usable(task_id):
                try:
                    pending = await pending_tasks_db.claim(self._pool, upstream.id, task_id)
                except DATABASE_ERRORS as exc:
                    # Still followed: a later reply (or its expiry) ends it.
                    log.warning("cannot end task %.100r: %s: %s", task_id, type(exc).__name__, exc)
                except Exception:
                    log.exception("cannot end task %.100r", task_id)
            if pending is None:  # not a call's task the gateway follows, or ended already
                self._call_log.release(reservation)
                continue
            status = "success" if entry.error is None else "error"
            # The toolset the call came through, whichever URL the reply ending it took.
            row = _row(
                pending.workspace_id,
                upstream.id,
                pending.tool_name,
                pending.caller_agent,
                status,
                pending.toolset_id,
            )
            duration_ms = round((ended_at - pending.started_at).total_seconds() * 1000)
            self._call_log.add(
                row._replace(
                    duration_ms=max(duration_ms, 0),
                    output_size_bytes=size,
                    error_message=entry.error,
                    created_at=ended_at,
                ),
                reservation,
            )


async def expire(
    pool: asyncpg.Pool, call_log: CallLog, now: datetime, batch_size: int, pause: float
) -> int:
    """Log the calls whose tasks expired with no end seen (the retention loop); returns how
    many. Their rows are queued like the proxy's, without a reservation."""
    total = 0
    while True:
        expired = await pending_tasks_db.expire(pool, now, batch_size)
        for task in expired:
            error = EXPIRED.format(task_id=_shown(task.task_id))
            row = _row(
                task.workspace_id,
                task.server_id,
                task.tool_name,
                task.caller_agent,
                "error",
                task.toolset_id,
            )
            call_log.add(row._replace(error_message=error, created_at=now))
        total += len(expired)
        if len(expired) < batch_size:
            return total
        await asyncio.sleep(pause)


def _row(
    workspace_id: Any,
    server_id: Any,
    tool_name: str,
    caller_agent: str | None,
    status: str,
    toolset_id: uuid.UUID | None,
) -> ToolCall:
    return ToolCall(
        id=new_call_id(),
        workspace_id=workspace_id,
        server_id=server_id,
        tool_name=tool_name,
        caller_agent=caller_agent,
        status=status,
        duration_ms=None,
        input_tokens=None,
        output_tokens=None,
        output_size_bytes=None,
        error_message=None,
        created_at=datetime.now(UTC),
        toolset_id=toolset_id,
    )


def _usable(task_id: str) -> bool:
    return 0 < len(task_id) <= MAX_TASK_ID and "\x00" not in task_id


def _shown(task_id: str) -> str:
    """A task id in an error message (a server's text: cut, and made storable)."""
    shown = task_id if len(task_id) <= 100 else task_id[:99] + "…"
    return shown.encode("utf-8", "replace").decode().replace("\x00", "")


def _followed_for(ttl_ms: int | None) -> timedelta:
    if ttl_ms is None or ttl_ms <= 0:
        return FOLLOW_DEFAULT
    return min(max(timedelta(milliseconds=min(ttl_ms, 10**12)), FOLLOW_AT_LEAST), FOLLOW_AT_MOST)


async def task_follower_context(app: web.Application) -> AsyncIterator[None]:
    """The cleanup context: after the call log's, so its jobs end before the log drains."""
    follower = TaskFollower(app[POOL], app[CALL_LOG])
    app[TASK_FOLLOWER] = follower
    yield
    await follower.close()


# The proxy's follower of calls that became tasks.
TASK_FOLLOWER: web.AppKey[TaskFollower] = web.AppKey("task_follower")
