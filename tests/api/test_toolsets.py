"""/toolsets: CRUD, every validation rule, the per-workspace bound, roles, API key rights and
tenancy, a deleted server leaving its toolsets, and the tools a toolset exposes over real SDK
servers (names, a conflict, a long name shortened, an unreachable member)."""

from __future__ import annotations

import hashlib
import itertools
import uuid
from typing import Any

import asyncpg
import pytest

from tests.helpers.alerting import add_server
from tests.helpers.api import Account, Api, AppFactory, Credential
from tests.helpers.upstreams import unused_url

_names = itertools.count(1)


async def create(api: Api, admin: Account, **fields: Any) -> dict[str, Any]:
    body = {"name": f"toolset-{next(_names)}", **fields}
    reply = await api.post("/toolsets", json=body, auth=admin, expect=201)
    toolset: dict[str, Any] = reply.body
    return toolset


async def key_with(api: Api, admin: Account, permissions: list[str]) -> str:
    reply = await api.post(
        f"/workspaces/{admin.workspace_id}/api-keys",
        json={"name": "agent", "permissions": permissions},
        auth=admin,
        expect=201,
    )
    key: str = reply.body["key"]
    return key


async def rows(db: asyncpg.Connection) -> tuple[list[Any], list[Any]]:
    """Every toolset and member row, to show that a refused request changed nothing."""
    toolsets = await db.fetch("SELECT * FROM toolsets ORDER BY id")
    members = await db.fetch("SELECT * FROM toolset_servers ORDER BY toolset_id, position")
    return [dict(r) for r in toolsets], [dict(r) for r in members]


# -- create, read, change, delete -------------------------------------------------------------


async def test_create_then_read_back(api: Api) -> None:
    admin = await api.signup()
    github = await add_server(api, admin, "GitHub Tools")
    files = await add_server(api, admin, "files")
    created = await create(
        api,
        admin,
        name="  Coding  ",
        description="what the coding agent needs",
        servers=[
            {"server_id": files, "tools": ["read_*", "list_dir", "read_*"], "prefix": ""},
            {"server_id": github},
        ],
    )
    assert created == {
        "id": created["id"],
        "name": "Coding",
        "description": "what the coding agent needs",
        # In the order given, with the duplicate glob dropped; omitted fields are null.
        "servers": [
            {"server_id": files, "tools": ["read_*", "list_dir"], "prefix": ""},
            {"server_id": github, "tools": None, "prefix": None},
        ],
        "url": f"http://gateway.test/api/v1/toolsets/{created['id']}/mcp",
        "created_at": created["created_at"],
        "updated_at": created["updated_at"],
    }
    assert (await api.get(f"/toolsets/{created['id']}", auth=admin, expect=200)).body == created
    assert (await api.get("/toolsets", auth=admin, expect=200)).body == [created]


async def test_the_url_starts_with_public_url(make_api: AppFactory) -> None:
    api = await make_api(public_url="https://mcp.example.org/")
    admin = await api.signup()
    created = await create(api, admin)
    assert created["url"] == f"https://mcp.example.org/api/v1/toolsets/{created['id']}/mcp"


async def test_a_toolset_may_start_empty_and_lists_are_ordered_by_name(api: Api) -> None:
    admin = await api.signup()
    for name in ("zeta", "Alpha", "beta"):
        created = await create(api, admin, name=name)
        assert (created["servers"], created["description"]) == ([], "")
    listed = (await api.get("/toolsets", auth=admin, expect=200)).body
    assert [t["name"] for t in listed] == ["Alpha", "beta", "zeta"]


async def test_a_patch_changes_only_what_it_sends_and_servers_replace_the_members(
    api: Api,
) -> None:
    admin = await api.signup()
    one, two, three = [await add_server(api, admin, f"s{i}") for i in range(3)]
    created = await create(
        api, admin, description="first", servers=[{"server_id": one}, {"server_id": two}]
    )
    path = f"/toolsets/{created['id']}"

    described = (await api.patch(path, json={"description": "second"}, auth=admin, expect=200)).body
    assert described["description"] == "second"
    assert (described["name"], described["servers"]) == (created["name"], created["servers"])
    assert described["updated_at"] > created["updated_at"]

    members = [
        {"server_id": three, "tools": ["echo"], "prefix": "t_"},
        {"server_id": one, "tools": None, "prefix": None},
    ]
    replaced = (await api.patch(path, json={"servers": members}, auth=admin, expect=200)).body
    assert replaced["servers"] == members
    assert replaced["description"] == "second"
    renamed = (await api.patch(path, json={"name": "renamed"}, auth=admin, expect=200)).body
    assert (renamed["name"], renamed["servers"]) == ("renamed", members)

    emptied = (await api.patch(path, json={"servers": []}, auth=admin, expect=200)).body
    assert emptied["servers"] == []
    assert (await api.get(path, auth=admin, expect=200)).body == emptied


async def test_delete_leaves_its_servers(api: Api, db: asyncpg.Connection) -> None:
    admin = await api.signup()
    server = await add_server(api, admin, "kept")
    created = await create(api, admin, servers=[{"server_id": server}])
    path = f"/toolsets/{created['id']}"
    reply = await api.delete(path, auth=admin, expect=204)
    assert reply.body is None
    assert (await api.get(path, auth=admin, expect=404)).detail == "toolset not found"
    await api.delete(path, auth=admin, expect=404)
    await api.get(f"/servers/{server}", auth=admin, expect=200)
    assert await rows(db) == ([], [])


async def test_a_name_is_unique_within_a_workspace(api: Api, db: asyncpg.Connection) -> None:
    admin = await api.signup()
    await create(api, admin, name="Research")
    other = await create(api, admin, name="Coding")
    before = await rows(db)
    for reply in (
        await api.post("/toolsets", json={"name": "Research"}, auth=admin, expect=400),
        await api.patch(
            f"/toolsets/{other['id']}", json={"name": " Research "}, auth=admin, expect=400
        ),
    ):
        assert reply.detail == "a toolset with this name already exists in this workspace"
    assert await rows(db) == before
    # Another workspace has names of its own.
    await create(api, await api.signup(), name="Research")


# -- validation ---------------------------------------------------------------------------------


async def _bad_bodies(api: Api, admin: Account) -> list[tuple[dict[str, Any], str]]:
    """(body, the detail it gets) for each rule; body.servers[0] is a server of admin's."""
    mine = await add_server(api, admin, "mine")
    theirs = await add_server(api, await api.signup(), "theirs")
    nobodys = str(uuid.uuid4())
    ok = {"server_id": mine}
    elsewhere = "not a server of this workspace"
    return [
        # Another workspace's server and nobody's get the same words: nothing is revealed.
        ({"servers": [ok, {"server_id": theirs}]}, f"body.servers.1.server_id: {elsewhere}"),
        ({"servers": [ok, {"server_id": nobodys}]}, f"body.servers.1.server_id: {elsewhere}"),
        (
            {"servers": [{"server_id": theirs}, ok, {"server_id": nobodys}]},
            f"body.servers.0.server_id: {elsewhere}; body.servers.2.server_id: {elsewhere}",
        ),
        (
            {"servers": [ok, {"server_id": mine, "prefix": "again_"}]},
            "body.servers.1.server_id: the same server as body.servers.0; "
            "a server is a member once",
        ),
        (
            {"servers": [{**ok, "tools": ["read_*", "read_[ab]"]}]},
            "body.servers.0.tools.1: only * (any characters) and ? (one character) are "
            "wildcards; '[]' cannot be used",
        ),
        (
            {"servers": [{**ok, "tools": [" echo"]}]},
            "body.servers.0.tools.0: a pattern is a tool name, optionally with * and ?, and no "
            "spaces around",
        ),
        ({"servers": [{**ok, "tools": "echo"}]}, "body.servers.0.tools: Input should be"),
        (
            {"servers": [{**ok, "prefix": "x" * 41}]},
            "body.servers.0.prefix: String should have at most 40 characters",
        ),
        (
            {"servers": [{**ok, "prefix": "gh."}]},
            "body.servers.0.prefix: may hold only letters, digits, _ and - (names clients accept)",
        ),
        ({"servers": [{**ok, "prefix": 5}]}, "body.servers.0.prefix: Input should be"),
        ({"servers": [{"server_id": "not-an-id"}]}, "body.servers.0.server_id: Input should be"),
        ({"servers": [{"tools": None}]}, "body.servers.0.server_id: Field required"),
        (
            {"servers": [{"server_id": str(uuid.uuid4())} for _ in range(51)]},
            "body.servers: List should have at most 50 items",
        ),
        ({"servers": {"server_id": mine}}, "body.servers: Input should be a valid array"),
        ({"name": "  "}, "body.name: String should have at least 1 character"),
        ({"name": "two\nlines"}, "body.name: must not contain control characters"),
        ({"description": "d" * 2001}, "body.description: String should have at most 2000"),
    ]


async def test_every_rule_is_a_422_naming_the_field_and_changes_nothing(
    api: Api, db: asyncpg.Connection
) -> None:
    admin = await api.signup()
    kept = await create(api, admin, name="kept")
    before = await rows(db)
    for body, detail in await _bad_bodies(api, admin):
        created = await api.post("/toolsets", json={"name": "new", **body}, auth=admin)
        patched = await api.patch(f"/toolsets/{kept['id']}", json=body, auth=admin)
        for reply in (created, patched):
            assert reply.status == 422, (body, reply.body)
            assert reply.detail.startswith(detail), (body, reply.detail)
    assert (await api.post("/toolsets", json={}, auth=admin, expect=422)).detail == (
        "body.name: Field required"
    )
    assert await rows(db) == before


async def test_a_prefix_may_be_empty_or_forty_characters(api: Api) -> None:
    admin = await api.signup()
    server = await add_server(api, admin, "s")
    for prefix in ("", "A-z_0" * 8):
        created = await create(api, admin, servers=[{"server_id": server, "prefix": prefix}])
        assert created["servers"][0]["prefix"] == prefix


async def test_fifty_members_are_allowed(make_api: AppFactory, db: asyncpg.Connection) -> None:
    api = await make_api()
    admin = await api.signup()
    workspace = uuid.UUID(admin.workspace_id)
    servers = [
        str(
            await db.fetchval(
                "INSERT INTO servers (workspace_id, name, url) VALUES ($1, $2, $3) RETURNING id",
                workspace,
                f"s{i:02}",
                "http://127.0.0.1:9/mcp",
            )
        )
        for i in range(50)
    ]
    created = await create(api, admin, servers=[{"server_id": s} for s in reversed(servers)])
    assert [m["server_id"] for m in created["servers"]] == servers[::-1]


# -- the bound --------------------------------------------------------------------------------


async def test_a_workspace_holds_at_most_its_bound_of_toolsets(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_api(max_toolsets_per_workspace=2)
    admin = await api.signup()
    first = await create(api, admin)
    await create(api, admin)
    reply = await api.post("/toolsets", json={"name": "one-too-many"}, auth=admin, expect=422)
    assert reply.detail == (
        "this workspace has 2 toolsets, the most this gateway allows "
        "(GATEWAY_MAX_TOOLSETS_PER_WORKSPACE): delete one first"
    )
    assert await db.fetchval("SELECT count(*) FROM toolsets") == 2
    await create(api, await api.signup())  # another workspace's bound is its own
    await api.delete(f"/toolsets/{first['id']}", auth=admin, expect=204)
    await api.post("/toolsets", json={"name": "one-too-many"}, auth=admin, expect=201)


# -- who may do what --------------------------------------------------------------------------


async def test_members_read_and_admins_change(api: Api, db: asyncpg.Connection) -> None:
    owner = await api.org(await api.signup())
    admin = await api.member(owner, "admin")
    member = await api.member(owner, "member")
    server = await add_server(api, owner, "s")
    toolset = await create(api, owner, servers=[{"server_id": server}])
    path = f"/toolsets/{toolset['id']}"

    assert (await api.get("/toolsets", auth=member, expect=200)).body == [toolset]
    assert (await api.get(path, auth=member, expect=200)).body == toolset
    await api.get(f"{path}/tools", auth=member, expect=200)
    before = await rows(db)
    await api.post("/toolsets", json={"name": "mine"}, auth=member, expect=403)
    await api.patch(path, json={"name": "mine"}, auth=member, expect=403)
    await api.delete(path, auth=member, expect=403)
    assert await rows(db) == before

    await api.patch(path, json={"name": "by the admin"}, auth=admin, expect=200)
    made = await create(api, admin, servers=[{"server_id": server}])
    await api.delete(f"/toolsets/{made['id']}", auth=admin, expect=204)


async def test_api_keys_read_with_the_read_permission_and_change_nothing(
    api: Api, db: asyncpg.Connection
) -> None:
    owner = await api.signup()
    toolset = await create(api, owner, servers=[{"server_id": await add_server(api, owner, "s")}])
    path = f"/toolsets/{toolset['id']}"
    reader = await key_with(api, owner, ["read"])
    proxy_only = await key_with(api, owner, ["proxy", "ingest"])
    for read in ("/toolsets", path, f"{path}/tools"):
        await api.get(read, auth=reader, expect=200)
        await api.get(read, auth=proxy_only, expect=403)
    before = await rows(db)
    for key in (reader, proxy_only):
        await api.post("/toolsets", json={"name": "k"}, auth=key, expect=403)
        await api.patch(path, json={"name": "k"}, auth=key, expect=403)
        await api.delete(path, auth=key, expect=403)
    assert await rows(db) == before


async def test_another_workspace_s_toolset_is_404(api: Api, db: asyncpg.Connection) -> None:
    owner = await api.signup()
    toolset = await create(
        api, owner, name="private", servers=[{"server_id": await add_server(api, owner, "s")}]
    )
    stranger = await api.org(await api.signup(), name="Elsewhere")
    strangers: list[Credential] = [stranger, await api.api_key(stranger)]
    before = await rows(db)
    for credential in strangers:
        for toolset_id in (toolset["id"], str(uuid.uuid4())):
            path = f"/toolsets/{toolset_id}"
            for reply in (
                await api.get(path, auth=credential),
                await api.get(f"{path}/tools", auth=credential),
            ):
                assert (reply.status, reply.detail) == (404, "toolset not found")
        assert (await api.get("/toolsets", auth=credential, expect=200)).body == []
    path = f"/toolsets/{toolset['id']}"
    await api.patch(path, json={"name": "taken"}, auth=stranger, expect=404)
    await api.delete(path, auth=stranger, expect=404)
    assert await rows(db) == before


# -- a deleted server ---------------------------------------------------------------------------


async def test_deleting_a_server_takes_it_out_of_its_toolsets(api: Api) -> None:
    admin = await api.signup()
    one, two, three = [await add_server(api, admin, f"s{i}") for i in range(3)]
    first = await create(
        api,
        admin,
        servers=[{"server_id": one}, {"server_id": two, "prefix": ""}, {"server_id": three}],
    )
    second = await create(api, admin, servers=[{"server_id": two}])
    await api.delete(f"/servers/{two}", auth=admin, expect=204)
    left = (await api.get(f"/toolsets/{first['id']}", auth=admin, expect=200)).body
    assert [m["server_id"] for m in left["servers"]] == [one, three]
    assert (await api.get(f"/toolsets/{second['id']}", auth=admin, expect=200)).body[
        "servers"
    ] == []
    # The deleted server cannot come back in by id.
    reply = await api.patch(
        f"/toolsets/{second['id']}", json={"servers": [{"server_id": two}]}, auth=admin
    )
    assert (reply.status, reply.detail) == (
        422,
        "body.servers.0.server_id: not a server of this workspace",
    )


# -- the tools it exposes -----------------------------------------------------------------------


def shortened(name: str) -> str:
    """A name over 64 characters as gateway/toolsets/names.py's docstring states it."""
    return f"{name[:55]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


async def test_the_tools_of_real_sdk_servers_with_a_conflict_a_long_name_and_a_dead_member(
    api: Api, sdk_stateless: str, sdk_stateful: str
) -> None:
    admin = await api.signup()
    alpha = await add_server(api, admin, "Alpha Tools!", sdk_stateless)
    beta = await add_server(api, admin, "beta", sdk_stateful)
    # Beta disables fail: the toolset never exposes it, whatever its globs say.
    await api.patch(f"/servers/{beta}", json={"disabled_tools": ["fail"]}, auth=admin, expect=200)
    gamma = await add_server(api, admin, "gamma", sdk_stateless)
    long_name = "A server whose name is long enough to need shortening"
    long = await add_server(api, admin, long_name, sdk_stateful)
    dead = await add_server(api, admin, "dead", unused_url())
    toolset = await create(
        api,
        admin,
        servers=[
            {"server_id": alpha, "tools": ["add", "ech?"]},
            {"server_id": dead},
            {"server_id": beta, "tools": ["echo", "fail"], "prefix": ""},
            {"server_id": gamma, "tools": ["e*"], "prefix": ""},
            {"server_id": long, "tools": ["region_of"]},
        ],
    )
    reply = await api.get(f"/toolsets/{toolset['id']}/tools", auth=admin, expect=200)
    tools = reply.body["tools"]
    long_exposed = "a_server_whose_name_is_long_enough_to_need_shortening__region_of"
    assert len(long_exposed) == 64  # at the cap: kept whole
    assert [(t["name"], t["server_id"], t["tool_name"]) for t in tools] == [
        ("alpha_tools__add", alpha, "add"),
        ("alpha_tools__echo", alpha, "echo"),
        ("echo", beta, "echo"),
        (long_exposed, long, "region_of"),
    ]
    echo = tools[1]
    assert echo["description"] == "Return the text unchanged."
    assert echo["inputSchema"]["properties"]["text"]["type"] == "string"
    assert echo["inputSchema"]["required"] == ["text"]
    # Gamma's echo comes out as "echo" too: beta, earlier in the list, keeps it.
    assert reply.body["conflicts"] == [
        {
            "name": "echo",
            "server_id": gamma,
            "tool_name": "echo",
            "kept_server_id": beta,
            "kept_tool_name": "echo",
        }
    ]
    [unavailable] = reply.body["unavailable"]
    assert unavailable["server_id"] == dead
    assert unavailable["detail"].startswith("cannot list the server's tools: ")

    # A longer name is shortened the same way every time; a rename changes the default prefix.
    longer = f"{long_name} and then some"
    await api.patch(f"/servers/{long}", json={"name": longer}, auth=admin, expect=200)
    reply = await api.get(f"/toolsets/{toolset['id']}/tools", auth=admin, expect=200)
    full = "a_server_whose_name_is_long_enough_to_need_shortening_and_then_some__region_of"
    assert reply.body["tools"][-1]["name"] == shortened(full)
    assert len(shortened(full)) == 64


async def test_a_member_prefix_may_change_the_names_and_end_a_conflict(
    api: Api, sdk_stateless: str, sdk_stateful: str
) -> None:
    admin = await api.signup()
    one = await add_server(api, admin, "one", sdk_stateless)
    two = await add_server(api, admin, "two", sdk_stateful)
    members = [
        {"server_id": one, "tools": ["add"], "prefix": ""},
        {"server_id": two, "tools": ["add"], "prefix": ""},
    ]
    toolset = await create(api, admin, servers=members)
    path = f"/toolsets/{toolset['id']}/tools"
    listed = (await api.get(path, auth=admin, expect=200)).body
    assert [(t["name"], t["server_id"]) for t in listed["tools"]] == [("add", one)]
    assert [c["server_id"] for c in listed["conflicts"]] == [two]
    members[1]["prefix"] = "two-"
    await api.patch(f"/toolsets/{toolset['id']}", json={"servers": members}, auth=admin, expect=200)
    listed = (await api.get(path, auth=admin, expect=200)).body
    assert [t["name"] for t in listed["tools"]] == ["add", "two-add"]
    assert listed["conflicts"] == []


async def test_an_empty_toolset_exposes_nothing(api: Api) -> None:
    admin = await api.signup()
    toolset = await create(api, admin)
    reply = await api.get(f"/toolsets/{toolset['id']}/tools", auth=admin, expect=200)
    assert reply.body == {"tools": [], "conflicts": [], "unavailable": []}


@pytest.mark.parametrize("dead", [1, 2])
async def test_members_that_cannot_be_listed_never_fail_the_answer(api: Api, dead: int) -> None:
    admin = await api.signup()
    servers = [await add_server(api, admin, f"dead-{i}", unused_url()) for i in range(dead)]
    toolset = await create(api, admin, servers=[{"server_id": s} for s in servers])
    reply = await api.get(f"/toolsets/{toolset['id']}/tools", auth=admin, expect=200)
    assert reply.body["tools"] == [] and reply.body["conflicts"] == []
    assert [u["server_id"] for u in reply.body["unavailable"]] == servers
