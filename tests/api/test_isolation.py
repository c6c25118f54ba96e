"""Tenant isolation, generated from the OpenAPI document: every operation that takes an id (in
its path, its query or its body) is called with the ids of another workspace, by that
workspace's stranger with a JWT and with an API key. Each answer is the one a random id gets
(404 where the caller may use the operation at all), names nothing of the other workspace, and
nothing in the database changes.

A new operation is covered as soon as it is in the document; one with a body or an id this file
does not know fails until a sample is added below.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from tests.helpers.api import Api, Credential, Reply
from tests.helpers.tenants import Ids, arrange_victim, snapshot

# A valid body for each request body schema (by $ref name, or the operationId of an inline one),
# with the ids to use: a body that fails validation would be refused before any lookup.
BODIES: dict[str, Callable[[Ids], Any]] = {
    "SwitchIn": lambda ids: {"workspace_id": ids["workspace_id"]},
    "WorkspacePatch": lambda ids: {"name": "Taken over"},
    "InviteIn": lambda ids: {"email": "spy@example.com", "role": "admin"},
    "MemberPatch": lambda ids: {"role": "owner"},
    "ApiKeyIn": lambda ids: {"name": "stolen"},
    "ApiKeyPatch": lambda ids: {"permissions": ["proxy"], "rate_limit": "1/day"},
    "ServerPatch": lambda ids: {"url": "http://127.0.0.1:9/stolen"},
    "InvokeIn": lambda ids: {"tool_name": "echo"},
    "ApproveIn": lambda ids: {},
    "ToolsetIn": lambda ids: {"name": "spy", "servers": [{"server_id": ids["server_id"]}]},
    "ToolsetPatch": lambda ids: {
        "name": "Taken over",
        "servers": [{"server_id": ids["server_id"]}],
    },
    "RuleIn": lambda ids: {
        "name": "spy",
        "server_id": ids["server_id"],
        "metric": "call_count",
        "operator": ">",
        "threshold": 0,
        "window_minutes": 5,
    },
    "RulePatch": lambda ids: {"enabled": False},
    "post__tool_calls": lambda ids: {
        "server_id": ids["server_id"],
        "tool_name": "spy",
        "status": "success",
    },
    "post__proxy_server_id_mcp": lambda ids: {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {}},
    },
    "post__toolsets_toolset_id_mcp": lambda ids: {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
    },
}


# Operations that take ids only as values of their body's fields: another workspace's id is a
# value this workspace cannot use, a 422 naming the field in the same words as for a random id.
REFUSED_AS_INVALID = {("POST", "/api/v1/toolsets")}


@dataclass(frozen=True)
class Attempt:
    method: str
    path: str  # the document's template
    query_ids: tuple[str, ...]
    body_schema: str | None
    api_keys_allowed: bool

    def request(self, ids: Ids) -> tuple[str, dict[str, str], Any]:
        path = self.path.removeprefix("/api/v1").format(**ids)
        params = {name: ids[name] for name in self.query_ids}
        body = None if self.body_schema is None else BODIES[self.body_schema](ids)
        return path, params, body


def _has_uuid(schema: Any, components: dict[str, Any]) -> bool:
    if isinstance(schema, dict) and "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    return '"format": "uuid"' in json.dumps(schema)


def attempts_from(document: dict[str, Any]) -> list[Attempt]:
    """Every operation that takes an id of a workspace's own things."""
    components = document["components"]["schemas"]
    found = []
    for path, item in document["paths"].items():
        for method, op in item.items():
            params = op.get("parameters", [])
            path_ids = [p for p in params if p["in"] == "path" and _has_uuid(p["schema"], {})]
            query_ids = tuple(
                p["name"] for p in params if p["in"] == "query" and _has_uuid(p["schema"], {})
            )
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            body_schema = None
            if body is not None:
                ref = body["schema"].get("$ref", "")
                body_schema = ref.rsplit("/", 1)[1] if ref else op["operationId"]
            body_ids = body is not None and (
                _has_uuid(body["schema"], components) or "{server_id}" in path
            )
            if path_ids or query_ids or body_ids:
                found.append(
                    Attempt(
                        method.upper(),
                        path,
                        query_ids,
                        body_schema,
                        {"apiKey": []} in op["security"],
                    )
                )
    return found


async def test_no_operation_lets_another_workspace_see_or_touch_anything(
    api: Api, db: asyncpg.Connection
) -> None:
    document = (await api.get("/openapi.json", expect=200)).body
    attempts = attempts_from(document)
    unknown = {a.body_schema for a in attempts if a.body_schema not in (None, *BODIES)}
    assert not unknown, f"add a valid body to BODIES for: {unknown}"
    victim = await arrange_victim(api)
    # The stranger owns a workspace of their own: no role check is what stops them.
    stranger = await api.org(await api.signup(name="Stranger"), name="Elsewhere")
    strangers: dict[str, Credential] = {"jwt": stranger, "key": await api.api_key(stranger)}
    random_ids = {name: str(uuid.uuid4()) for name in victim.ids}
    before = await snapshot(db)

    wrong = []
    for attempt in attempts:
        for kind, credential in strangers.items():
            answers: list[Reply] = []
            for ids in (victim.ids, random_ids):
                path, params, body = attempt.request(ids)
                answers.append(
                    await api.request(
                        attempt.method, path, params=params, json=body, auth=credential
                    )
                )
            theirs, nobodys = answers
            where = f"{attempt.method} {attempt.path} with a stranger's {kind}"
            expected = 403 if kind == "key" and not attempt.api_keys_allowed else 404
            if expected == 404 and (attempt.method, attempt.path) in REFUSED_AS_INVALID:
                expected = 422
            if attempt.method == "OPTIONS":
                expected = 204  # a CORS preflight: the same for every id, nothing looked up
            elif attempt.method == "GET" and attempt.query_ids:
                expected = 200  # a list filtered by an id: the stranger's own (empty) list
            if theirs.status != expected:
                wrong.append(f"{where}: {theirs.status} {theirs.body!r}, expected {expected}")
            if (theirs.status, theirs.body) != (nobodys.status, nobodys.body) and expected != 200:
                wrong.append(f"{where}: answers differently for a real id than for a random one")
            leaked = [s for s in victim.secrets if s in json.dumps(theirs.body)]
            if leaked:
                wrong.append(f"{where}: the answer names {leaked}")
    assert not wrong, "\n".join(wrong)
    assert len(attempts) >= 30  # the document was read, not an empty list walked

    after = await snapshot(db)
    changed = [table for table in before if before[table] != after[table]]
    assert not changed, f"a stranger changed rows of {changed}"
