"""Which member of a toolset holds a followed task, as the toolset's endpoint asks
(gateway/db/pending_tasks.holder): among the members only, and of two that issued the same task
id, the one the call went to through this toolset, then the earlier in the toolset's list."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from gateway.db import pending_tasks
from gateway.db.pending_tasks import PendingTask
from tests.helpers.api import Api
from tests.helpers.proxying import add_server


async def test_the_holder_is_a_member_preferring_the_toolset_s_own_call_then_the_list(
    api: Api, db: asyncpg.Connection
) -> None:
    owner = await api.signup()
    workspace = uuid.UUID(owner.workspace_id)
    first, second, outsider = [
        uuid.UUID(await add_server(api, db, owner, "http://127.0.0.1:9/mcp")) for _ in range(3)
    ]
    ours, theirs = uuid.uuid4(), uuid.uuid4()
    now = datetime.now(UTC)

    async def followed(server_id: uuid.UUID, task_id: str, toolset_id: uuid.UUID | None) -> None:
        task = PendingTask(
            server_id, task_id, workspace, "job", None, now, now + timedelta(hours=1), toolset_id
        )
        assert await pending_tasks.follow(db, task, 100) == (True, True)

    await followed(first, "same", None)
    await followed(second, "same", ours)
    await followed(first, "both proxied", None)
    await followed(second, "both proxied", None)
    await followed(first, "other toolset", theirs)
    await followed(second, "other toolset", None)
    await followed(outsider, "outside", ours)
    members = [first, second]
    assert await pending_tasks.holder(db, "same", members, ours) == second
    assert await pending_tasks.holder(db, "both proxied", members, ours) == first
    assert await pending_tasks.holder(db, "both proxied", [second, first], ours) == second
    assert await pending_tasks.holder(db, "other toolset", members, ours) == first
    assert await pending_tasks.holder(db, "outside", members, ours) is None
    assert await pending_tasks.holder(db, "nobody's", members, ours) is None
    assert await pending_tasks.holder(db, "same", [], ours) is None
