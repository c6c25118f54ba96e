"""Tool integrity in tests: servers probed on demand, their recorded changes, tool lists to edit."""

from __future__ import annotations

import copy
from typing import Any

from gateway.upstreams.fingerprints import TOOL_WATCH
from tests.helpers.api import Account, Api


async def register(api: Api, admin: Account, url: str, **fields: Any) -> str:
    reply = await api.post(
        "/servers", json={"name": "watched", "url": url, **fields}, auth=admin, expect=201
    )
    server_id: str = reply.body["id"]
    return server_id


async def probe(api: Api, admin: Account, server_id: str) -> None:
    """One probe now (its tool list is recorded before it answers)."""
    await api.post(f"/servers/{server_id}/probe", auth=admin, expect=200)


async def changes(api: Api, admin: Account, server_id: str, **page: int) -> dict[str, Any]:
    reply = await api.get(
        f"/servers/{server_id}/tools/changes", params=page, auth=admin, expect=200
    )
    body: dict[str, Any] = reply.body
    return body


async def recorded(api: Api) -> None:
    """Until the lists seen in the background (playground, proxied replies) are stored."""
    await api.app[TOOL_WATCH].drain()


def edited(tools: list[dict[str, Any]], name: str, **fields: Any) -> list[dict[str, Any]]:
    """The list with one tool's fields replaced (a new list: the old one stays as it was)."""
    tools = copy.deepcopy(tools)
    for tool in tools:
        if tool["name"] == name:
            tool.update(fields)
    return tools
