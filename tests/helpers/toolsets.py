"""Toolsets in tests: a workspace whose servers make one toolset, and the names it exposes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from tests.helpers.api import Account, Api
from tests.helpers.proxying import ACCEPT, add_server


@dataclass
class Arranged:
    api: Api
    owner: Account
    key: str
    toolset_id: str
    # Member server ids, in the toolset's order, and their names.
    servers: list[str]
    names: list[str]

    @property
    def path(self) -> str:
        return f"/api/v1/toolsets/{self.toolset_id}/mcp"

    @property
    def url(self) -> str:
        return str(self.api.client.make_url(self.path))


async def arrange_toolset(api: Api, db: asyncpg.Connection, urls: list[str]) -> Arranged:
    """A workspace with a key, a server per URL, and a toolset of them all (default prefixes)."""
    owner = await api.signup()
    key = await api.api_key(owner)
    workspace_id = uuid.UUID(owner.workspace_id)
    servers = [await add_server(api, db, owner, url) for url in urls]
    toolset_id = await db.fetchval(
        "INSERT INTO toolsets (workspace_id, name) VALUES ($1, 'agent tools') RETURNING id",
        workspace_id,
    )
    for position, server_id in enumerate(servers):
        await db.execute(
            "INSERT INTO toolset_servers (toolset_id, server_id, position) VALUES ($1, $2, $3)",
            toolset_id,
            uuid.UUID(server_id),
            position,
        )
    names = [
        await db.fetchval("SELECT name FROM servers WHERE id = $1", uuid.UUID(s)) for s in servers
    ]
    return Arranged(api, owner, key, str(toolset_id), servers, names)


def prefix(server_name: str) -> str:
    return server_name.replace("-", "_") + "__"


async def post(toolset: Arranged, key: str, message: Any, **headers: str) -> tuple[int, Any, Any]:
    """A raw POST to the toolset's endpoint: (status, JSON body or None, headers)."""
    response = await toolset.api.client.post(
        toolset.path,
        data=orjson.dumps(message),
        headers={"X-API-Key": key, "Accept": ACCEPT, "Content-Type": "application/json", **headers},
    )
    raw = await response.read()
    return response.status, orjson.loads(raw) if raw else None, response.headers
