"""Two tenants for the isolation tests: a victim workspace with one of everything, and a
snapshot of the database to show that a stranger changed nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

from tests.helpers.alerting import add_rule, add_server, evaluate, ingest
from tests.helpers.api import Account, Api
from tests.helpers.oauth_grants import grant, proxy_path
from tests.helpers.toolset_calls import write_calls

Ids = dict[str, str]


@dataclass
class Victim:
    owner: Account
    ids: Ids
    # Texts only the victim's workspace holds: none may appear in a stranger's answers.
    secrets: tuple[str, ...]


async def arrange_victim(api: Api) -> Victim:
    owner = await api.org(await api.signup(name="Victim Owner"), name="Victim Inc")
    member = await api.member(owner)
    invite = await api.invite(owner, "invitee@example.com")
    key = await api.post(
        f"/workspaces/{owner.workspace_id}/api-keys", json={"name": "victim-key"}, auth=owner
    )
    server_id = await add_server(api, owner, "victim-server")
    rule = await add_rule(
        api, owner, name="victim-rule", metric="call_count", operator=">=", threshold=1
    )
    toolset = await api.post(
        "/toolsets",
        json={"name": "victim-toolset", "servers": [{"server_id": server_id}]},
        auth=owner,
        expect=201,
    )
    await ingest(api, owner, server_id, [{"tool_name": "victim-tool"}])
    toolset_id = toolset.body["id"]
    through = {"server_id": server_id, "tool_name": "victim-tool", "status": "success"}
    now = datetime.now(UTC).isoformat()
    await write_calls(
        api, owner.workspace_id, [{**through, "created_at": now, "toolset_id": toolset_id}]
    )
    await evaluate(api)
    connected = await grant(api, owner, proxy_path(server_id), "victim-app")
    events = await api.get("/alerts/events", auth=owner, expect=200)
    calls = await api.get("/tool-calls", auth=owner, expect=200)
    ids = {
        "workspace_id": owner.workspace_id,
        "user_id": member.user_id,
        "invite_id": invite["id"],
        "key_id": key.body["id"],
        "server_id": server_id,
        "toolset_id": toolset_id,
        "rule_id": rule["id"],
        "event_id": events.body["items"][0]["id"],
        "call_id": calls.body["items"][0]["id"],
        "grant_id": str(connected.grant_id),
    }
    secrets = (
        *ids.values(),
        "Victim Inc",
        "victim-server",
        "victim-toolset",
        "victim-rule",
        "victim-tool",
        "victim-app",
    )
    return Victim(owner, ids, secrets)


async def snapshot(db: asyncpg.Connection) -> dict[str, list[str]]:
    """Every row of every table; when a key or a dashboard session was last used aside (the
    stranger uses their own)."""
    tables = await db.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
    )
    rows = {}
    for (table,) in tables:
        rows[table] = sorted(
            r[0]
            for r in await db.fetch(
                f"SELECT (to_jsonb(t) - 'last_used_at' - 'last_seen_at')::text FROM {table} t"
            )
        )
    return rows
