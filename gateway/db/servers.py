"""SQL for the server registry."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from gateway.db.types import Executor


@dataclass(frozen=True, slots=True)
class UpstreamRow:
    """What the proxy and the MCP client need to reach a server (credentials still sealed)."""

    id: uuid.UUID
    workspace_id: uuid.UUID
    name: str
    url: str
    auth_type: str | None
    credentials: bytes | None


_UPSTREAM = """
SELECT id, workspace_id, name, url, auth_type, credentials FROM servers WHERE id = $1
"""


async def upstream(db: Executor, server_id: uuid.UUID) -> UpstreamRow | None:
    row = await db.fetchrow(_UPSTREAM, server_id)
    return None if row is None else UpstreamRow(**dict(row))
