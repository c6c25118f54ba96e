"""SQL for the tasks proxied tools/calls turned into, followed until their end passes through
any gateway process (gateway/proxy/tasks.py): one row per task, deleted by the reply that ends
it, or by the retention loop once it expired. A toolset finds here which member holds a task."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import NamedTuple

from gateway.db.types import Executor


class PendingTask(NamedTuple):
    """A followed task: the call it stands for, as the tools/call left it."""

    server_id: uuid.UUID
    task_id: str
    workspace_id: uuid.UUID
    tool_name: str
    caller_agent: str | None
    started_at: datetime
    expires_at: datetime
    # The toolset the call came through; None for the server's own proxy URL.
    toolset_id: uuid.UUID | None


_COLUMNS = (
    "server_id, task_id, workspace_id, tool_name, caller_agent, started_at, expires_at, toolset_id"
)

# Added unless the workspace already follows $9 tasks (counted up to $9 only), or the server
# named the same task twice. Returns (there was room, it was added).
_FOLLOW = f"""
WITH room AS (
    SELECT count(*) < $9 AS free
    FROM (SELECT 1 FROM pending_tasks WHERE workspace_id = $3 LIMIT $9) AS followed
), added AS (
    INSERT INTO pending_tasks ({_COLUMNS})
    SELECT $1, $2, $3, $4, $5, $6, $7, $8 FROM room WHERE room.free
    ON CONFLICT (server_id, task_id) DO NOTHING
    RETURNING 1
)
SELECT (SELECT free FROM room), EXISTS (SELECT 1 FROM added)
"""

# The delete decides which reply ends the task: of two racing (two processes, or a poll and a
# cancel), one gets the row and the other nothing, so the call is logged once.
_CLAIM = f"""
DELETE FROM pending_tasks WHERE server_id = $1 AND task_id = $2
RETURNING {_COLUMNS}
"""

# Which of a toolset's members ($2, in the toolset's order) holds the task: the toolset routes
# requests about it there. Two members may name the same task id; then the one the call went
# to through this toolset ($3), else the first in the list. (The primary key finds each.)
_HOLDER = """
SELECT server_id FROM pending_tasks
WHERE server_id = ANY($2::uuid[]) AND task_id = $1
ORDER BY toolset_id IS DISTINCT FROM $3, array_position($2::uuid[], server_id)
LIMIT 1
"""

_EXPIRE = f"""
DELETE FROM pending_tasks
WHERE (server_id, task_id) IN (
    SELECT server_id, task_id FROM pending_tasks WHERE expires_at <= $1
    ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED
)
RETURNING {_COLUMNS}
"""


async def follow(db: Executor, task: PendingTask, most: int) -> tuple[bool, bool]:
    """Add a task to follow, unless its workspace follows `most` already: (there was room,
    it was added; False when the server's task id is followed already)."""
    row = await db.fetchrow(_FOLLOW, *task, most)
    assert row is not None
    return bool(row[0]), bool(row[1])


async def claim(db: Executor, server_id: uuid.UUID, task_id: str) -> PendingTask | None:
    """Take the task out, ended: None when it is not followed (any more)."""
    row = await db.fetchrow(_CLAIM, server_id, task_id)
    return None if row is None else PendingTask(*row)


async def holder(
    db: Executor, task_id: str, server_ids: list[uuid.UUID], toolset_id: uuid.UUID
) -> uuid.UUID | None:
    """The server among `server_ids` (a toolset's members, in order) whose task `task_id` is
    followed; None when none is."""
    server_id: uuid.UUID | None = await db.fetchval(_HOLDER, task_id, server_ids, toolset_id)
    return server_id


async def expire(db: Executor, now: datetime, batch_size: int) -> list[PendingTask]:
    """Take out up to `batch_size` tasks that expired by `now`."""
    return [PendingTask(*row) for row in await db.fetch(_EXPIRE, now, batch_size)]
