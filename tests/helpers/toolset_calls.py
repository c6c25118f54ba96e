"""Tool calls that came through toolsets, in tests: toolset rows made with plain SQL (their API
lives elsewhere), and calls written through the real call log writer with their toolset_id,
as the toolset endpoint writes them (POST /tool-calls cannot: it never sets a toolset)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gateway.calllog.records import ToolCall, new_call_id
from gateway.calllog.writer import CALL_LOG
from gateway.db.types import Executor
from tests.helpers.api import Api


async def add_toolset(
    db: Executor, workspace_id: str, name: str, servers: Sequence[str] = ()
) -> str:
    """A toolset row of the workspace over `servers` (in order), as the toolsets API would
    store it; its id."""
    toolset_id = await db.fetchval(
        "INSERT INTO toolsets (workspace_id, name) VALUES ($1, $2) RETURNING id",
        uuid.UUID(workspace_id),
        name,
    )
    await db.executemany(
        "INSERT INTO toolset_servers (toolset_id, server_id, position) VALUES ($1, $2, $3)",
        [(toolset_id, uuid.UUID(server), position) for position, server in enumerate(servers)],
    )
    return str(toolset_id)


def record(workspace_id: str, call: dict[str, Any]) -> ToolCall:
    """The call log row of a call given as POST /tool-calls takes it, plus `toolset_id`."""
    toolset_id = call.get("toolset_id")
    return ToolCall(
        id=new_call_id(),
        workspace_id=uuid.UUID(workspace_id),
        server_id=uuid.UUID(call["server_id"]),
        tool_name=call["tool_name"],
        caller_agent=call.get("caller_agent"),
        status=call["status"],
        duration_ms=call.get("duration_ms"),
        input_tokens=None,
        output_tokens=None,
        output_size_bytes=None,
        error_message=call.get("error_message"),
        created_at=datetime.fromisoformat(call["created_at"]),
        toolset_id=None if toolset_id is None else uuid.UUID(toolset_id),
    )


async def write_calls(
    api: Api, workspace_id: str, calls: Sequence[dict[str, Any]]
) -> list[ToolCall]:
    """Store calls (dicts as for POST /tool-calls, each maybe with a `toolset_id`) through the
    app's call log writer, committed when this returns; the records written."""
    records = [record(workspace_id, call) for call in calls]
    await api.app[CALL_LOG].write(records)
    return records
