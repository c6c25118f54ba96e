"""A server's governed-access fields: disabled tools and a rate limit, set on create or PATCH,
validated field by field, and applied in the playground as in the proxy."""

from __future__ import annotations

import asyncpg
import pytest

from tests.helpers.api import Api
from tests.helpers.proxying import logged_calls


async def test_a_server_is_created_and_changed_with_its_rules(api: Api, sdk_stateless: str) -> None:
    admin = await api.signup()
    created = await api.post(
        "/servers",
        json={"name": "files", "url": sdk_stateless, "disabled_tools": ["delete_*"]},
        auth=admin,
        expect=201,
    )
    assert (created.body["disabled_tools"], created.body["rate_limit"]) == (["delete_*"], None)
    path = f"/servers/{created.body['id']}"
    patched = await api.patch(path, json={"rate_limit": "60/minute"}, auth=admin, expect=200)
    assert (patched.body["disabled_tools"], patched.body["rate_limit"]) == (
        ["delete_*"],
        "60/minute",
    )
    cleared = await api.patch(
        path, json={"disabled_tools": [], "rate_limit": None}, auth=admin, expect=200
    )
    assert (cleared.body["disabled_tools"], cleared.body["rate_limit"]) == ([], None)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"disabled_tools": ["a{b,c}"]}, "body.disabled_tools.0"),
        ({"disabled_tools": "delete_*"}, "body.disabled_tools"),
        ({"rate_limit": "0/minute"}, "body.rate_limit"),
        ({"rate_limit": "many"}, "body.rate_limit"),
    ],
)
async def test_bad_rules_are_422_naming_the_field_and_change_nothing(
    api: Api, db: asyncpg.Connection, sdk_stateless: str, fields: dict[str, object], named: str
) -> None:
    admin = await api.signup()
    server = await api.post(
        "/servers", json={"name": "s", "url": sdk_stateless}, auth=admin, expect=201
    )
    before = await db.fetch("SELECT * FROM servers ORDER BY id")
    created = await api.post(
        "/servers", json={"name": "t", "url": sdk_stateless, **fields}, auth=admin, expect=422
    )
    assert created.detail.startswith(named), created.detail
    patched = await api.patch(f"/servers/{server.body['id']}", json=fields, auth=admin, expect=422)
    assert patched.detail.startswith(named), patched.detail
    assert await db.fetch("SELECT * FROM servers ORDER BY id") == before


async def test_the_playground_marks_disabled_tools_and_refuses_to_call_them(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    admin = await api.signup()
    server = await api.post(
        "/servers",
        json={"name": "s", "url": sdk_stateless, "disabled_tools": ["ec*"]},
        auth=admin,
        expect=201,
    )
    tools = f"/servers/{server.body['id']}/tools"
    listed = await api.get(tools, auth=admin, expect=200)
    disabled = {tool["name"]: tool["disabled"] for tool in listed.body["tools"]}
    assert disabled["echo"] is True and disabled["add"] is False
    refused = await api.post(
        f"{tools}/invoke", json={"tool_name": "echo", "arguments": {"text": "x"}}, auth=admin
    )
    assert (refused.status, refused.detail) == (403, "tool 'echo' is disabled on this server")
    rows = await logged_calls(db, 1)
    assert (rows[0]["tool_name"], rows[0]["status"]) == ("echo", "error")
    assert rows[0]["error_message"] == "refused: tool 'echo' is disabled on this server"
    await api.post(
        f"{tools}/invoke",
        json={"tool_name": "add", "arguments": {"a": 1, "b": 2}},
        auth=admin,
        expect=200,
    )


async def test_the_playground_counts_against_the_server_s_limit(
    api: Api, sdk_stateless: str
) -> None:
    admin = await api.signup()
    server = await api.post(
        "/servers",
        json={"name": "s", "url": sdk_stateless, "rate_limit": "1/hour"},
        auth=admin,
        expect=201,
    )
    invoke = f"/servers/{server.body['id']}/tools/invoke"
    body = {"tool_name": "add", "arguments": {"a": 1, "b": 2}}
    await api.post(invoke, json=body, auth=admin, expect=200)
    limited = await api.post(invoke, json=body, auth=admin, expect=429)
    assert limited.detail == "the server's rate limit of 1/hour is reached"
    assert 1 <= int(limited.headers["Retry-After"]) <= 3600
