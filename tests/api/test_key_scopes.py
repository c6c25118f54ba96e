"""API keys' governed-access fields: what a create sets, what a PATCH changes (only the fields
sent), and every bad value refused with a 422 that names the field, changing nothing."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from tests.helpers.alerting import add_server
from tests.helpers.api import Account, Api


async def make_key(api: Api, admin: Account, **fields: object) -> dict[str, object]:
    reply = await api.post(
        f"/workspaces/{admin.workspace_id}/api-keys",
        json={"name": "agent", **fields},
        auth=admin,
        expect=201,
    )
    body: dict[str, object] = reply.body
    return body


async def test_a_new_key_may_do_everything_unless_told_otherwise(api: Api) -> None:
    admin = await api.signup()
    key = await make_key(api, admin)
    assert key["permissions"] == ["proxy", "ingest", "read"]
    assert (key["allowed_servers"], key["allowed_tools"], key["rate_limit"]) == (None, None, None)


async def test_a_key_is_created_with_its_scope_and_listed_with_it(api: Api) -> None:
    admin = await api.signup()
    server_id = await add_server(api, admin, "files")
    key = await make_key(
        api,
        admin,
        permissions=["read", "proxy", "read"],
        allowed_servers=[server_id],
        allowed_tools=["read_*", "search"],
        rate_limit=" 100/minute ",
    )
    assert key["permissions"] == ["proxy", "read"]
    assert key["allowed_servers"] == [server_id]
    assert key["allowed_tools"] == ["read_*", "search"]
    assert key["rate_limit"] == "100/minute"
    listed = await api.get(f"/workspaces/{admin.workspace_id}/api-keys", auth=admin)
    assert {k: listed.body[0][k] for k in key if k != "key"} == {
        k: v for k, v in key.items() if k != "key"
    }


async def test_a_patch_changes_only_the_fields_it_sends(api: Api) -> None:
    admin = await api.signup()
    key = await make_key(api, admin, allowed_tools=["read_*"], rate_limit="5/second")
    path = f"/workspaces/{admin.workspace_id}/api-keys/{key['id']}"
    patched = await api.patch(path, json={"rate_limit": "10/hour"}, auth=admin, expect=200)
    assert (patched.body["allowed_tools"], patched.body["rate_limit"]) == (["read_*"], "10/hour")
    cleared = await api.patch(path, json={"allowed_tools": None}, auth=admin, expect=200)
    assert (cleared.body["allowed_tools"], cleared.body["rate_limit"]) == (None, "10/hour")
    assert cleared.body["name"] == "agent"


async def test_only_admins_change_a_key_and_only_in_their_workspace(api: Api) -> None:
    admin = await api.signup()
    member = await api.member(admin)
    key = await make_key(api, admin)
    path = f"/workspaces/{admin.workspace_id}/api-keys/{key['id']}"
    await api.patch(path, json={"rate_limit": "1/day"}, auth=member, expect=403)
    stranger = await api.signup()
    elsewhere = f"/workspaces/{stranger.workspace_id}/api-keys/{key['id']}"
    await api.patch(elsewhere, json={"rate_limit": "1/day"}, auth=stranger, expect=404)
    await api.patch(f"{path[:-36]}{uuid.uuid4()}", json={}, auth=admin, expect=404)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"permissions": ["proxy", "admin"]}, "body.permissions.1"),
        ({"permissions": "proxy"}, "body.permissions"),
        ({"allowed_tools": ["read_[ab]"]}, "body.allowed_tools.0"),
        ({"allowed_tools": [""]}, "body.allowed_tools.0"),
        ({"allowed_tools": "read_*"}, "body.allowed_tools"),
        ({"allowed_servers": ["not-a-uuid"]}, "body.allowed_servers.0"),
        ({"rate_limit": "0/minute"}, "body.rate_limit"),
        ({"rate_limit": "10/week"}, "body.rate_limit"),
        ({"rate_limit": 10}, "body.rate_limit"),
    ],
)
async def test_bad_scope_values_are_422_naming_the_field_and_change_nothing(
    api: Api, db: asyncpg.Connection, fields: dict[str, object], named: str
) -> None:
    admin = await api.signup()
    key = await make_key(api, admin)
    before = await db.fetch("SELECT * FROM api_keys ORDER BY id")
    path = f"/workspaces/{admin.workspace_id}/api-keys"
    created = await api.post(path, json={"name": "x", **fields}, auth=admin, expect=422)
    assert created.detail.startswith(named), created.detail
    patched = await api.patch(f"{path}/{key['id']}", json=fields, auth=admin, expect=422)
    assert patched.detail.startswith(named), patched.detail
    assert await db.fetch("SELECT * FROM api_keys ORDER BY id") == before


async def test_servers_of_another_workspace_are_refused_by_id(
    api: Api, db: asyncpg.Connection
) -> None:
    admin, stranger = await api.signup(), await api.signup()
    theirs = await add_server(api, stranger, "theirs")
    path = f"/workspaces/{admin.workspace_id}/api-keys"
    refused = await api.post(
        path, json={"name": "x", "allowed_servers": [theirs]}, auth=admin, expect=422
    )
    assert refused.detail == f"body.allowed_servers: not servers of this workspace: {theirs}"
    key = await make_key(api, admin)
    await api.patch(
        f"{path}/{key['id']}", json={"allowed_servers": [theirs]}, auth=admin, expect=422
    )
    assert (
        await db.fetchval(
            "SELECT allowed_servers FROM api_keys WHERE id = $1", uuid.UUID(str(key["id"]))
        )
        is None
    )


async def test_a_deleted_server_leaves_the_keys_scoped_to_it(api: Api) -> None:
    admin = await api.signup()
    kept, deleted = await add_server(api, admin, "kept"), await add_server(api, admin, "gone")
    only_deleted = await make_key(api, admin, allowed_servers=[deleted])
    both = await make_key(api, admin, allowed_servers=[kept, deleted])
    await api.delete(f"/servers/{deleted}", auth=admin, expect=204)
    listed = {
        k["id"]: k
        for k in (await api.get(f"/workspaces/{admin.workspace_id}/api-keys", auth=admin)).body
    }
    # Scoped to nothing now: never widened to every server.
    assert listed[only_deleted["id"]]["allowed_servers"] == []
    assert listed[both["id"]]["allowed_servers"] == [kept]
