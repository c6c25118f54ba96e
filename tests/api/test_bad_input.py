"""Every bad input gets a clear answer naming what is wrong, and changes nothing: NUL
characters, numbers and times beyond what PostgreSQL stores, non-standard JSON, other media."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.proxying import add_server

NUL = "a\x00b"


async def owner_with_server(api: Api, db: asyncpg.Connection) -> tuple[Account, str]:
    owner = await api.org(await api.signup(), "Hardened")
    return owner, await add_server(api, db, owner, "http://127.0.0.1:9/mcp")


async def row_counts(db: asyncpg.Connection) -> dict[str, int]:
    tables = ("users", "workspaces", "servers", "alert_rules", "api_keys", "tool_calls")
    return {t: await db.fetchval(f"SELECT count(*) FROM {t}") for t in tables}


async def test_nul_characters_in_bodies_are_refused_by_field(
    api: Api, db: asyncpg.Connection
) -> None:
    owner, server_id = await owner_with_server(api, db)
    url = "http://a.example/mcp"
    cases = [
        ("POST", "/servers", {"name": NUL, "url": url}, "body.name"),
        ("POST", "/servers", {"name": "s", "url": url, "description": NUL}, "body.description"),
        ("POST", "/servers", {"name": "s", "url": f"http://a.example/{NUL}"}, "body.url"),
        ("POST", "/servers", {"name": "s", "url": url, "tags": ["ok", NUL]}, "body.tags"),
        ("PATCH", f"/servers/{server_id}", {"name": NUL}, "body.name"),
        (
            "POST",
            "/alerts/rules",
            {"name": NUL, "metric": "call_count", "operator": ">", "threshold": 1,
             "window_minutes": 5},
            "body.name",
        ),
        (
            "POST",
            "/alerts/rules",
            {"name": "r", "metric": "call_count", "operator": ">", "threshold": 1,
             "window_minutes": 5, "webhook_url": f"https://hooks.example/{NUL}"},
            "body.webhook_url",
        ),
        ("POST", "/workspaces", {"name": NUL}, "body.name"),
        ("PATCH", f"/workspaces/{owner.workspace_id}", {"name": NUL}, "body.name"),
        ("POST", f"/workspaces/{owner.workspace_id}/api-keys", {"name": NUL}, "body.name"),
    ]  # fmt: skip
    before = await row_counts(db)
    for method, path, body, field in cases:
        reply = await api.request(method, path, json=body, auth=owner, expect=422)
        assert reply.detail == f"{field}: must not contain NUL characters", (path, reply.detail)
    signup = {"email": "n@example.com", "password": "password123", "name": NUL}
    reply = await api.post("/auth/signup", json=signup, expect=422)
    assert reply.detail.startswith("body.name: must not contain NUL")
    signup = {**signup, "name": "N", "invite_token": NUL}
    reply = await api.post("/auth/signup", json=signup, expect=422)
    assert reply.detail.startswith("body.invite_token: must not contain NUL")
    reply = await api.post("/auth/accept-invite/a%00b", auth=owner, expect=422)
    assert reply.detail == "path.token: must not contain NUL characters"
    assert await row_counts(db) == before


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/servers", "search"),
        ("/servers", "tag"),
        ("/tool-calls", "tool_name"),
        ("/tool-calls", "caller_agent"),
    ],
)
async def test_nul_characters_in_query_parameters(
    api: Api, db: asyncpg.Connection, path: str, param: str
) -> None:
    owner, _ = await owner_with_server(api, db)
    reply = await api.get(path, params={param: NUL}, auth=owner, expect=422)
    assert reply.detail == f"query.{param}: must not contain NUL characters"


@pytest.mark.parametrize("path", ["/tool-calls", "/health/checks", "/alerts/events"])
async def test_offsets_beyond_a_bigint(api: Api, db: asyncpg.Connection, path: str) -> None:
    owner, _ = await owner_with_server(api, db)
    reply = await api.get(path, params={"offset": 2**63}, auth=owner, expect=422)
    assert reply.detail.startswith("query.offset: Input should be less than or equal to")
    await api.get(path, params={"offset": 2**63 - 1}, auth=owner, expect=200)


async def test_the_largest_offset_with_several_tools_matching(
    api: Api, db: asyncpg.Connection
) -> None:
    """A tool_name matching several tools pages through each of them: limit + offset must not
    leave the bigint range either."""
    owner, server_id = await owner_with_server(api, db)
    calls = [{"server_id": server_id, "tool_name": n, "status": "success"} for n in ("ab", "abc")]
    await api.post("/tool-calls", json=calls, auth=owner, expect=201)
    params = {"tool_name": "ab", "offset": 2**63 - 1, "limit": 200}
    reply = await api.get("/tool-calls", params=params, auth=owner, expect=200)
    assert reply.body == {"items": [], "total": 2}


async def test_times_at_the_edges_and_numbers_are_not_timestamps(
    api: Api, db: asyncpg.Connection
) -> None:
    owner, server_id = await owner_with_server(api, db)
    key = await api.api_key(owner)
    for start, problem in (
        ("0001-01-01T00:00:00+14:00", "is out of range"),
        ("0.5", "must be an ISO 8601 timestamp"),
        ("1700000000", "must be an ISO 8601 timestamp"),
    ):
        reply = await api.get("/tool-calls", params={"start": start}, auth=key, expect=422)
        assert reply.detail.startswith(f"query.start: {problem}"), reply.detail
    late = {"server_id": server_id, "tool_name": "t", "status": "success",
            "created_at": "9999-12-31T23:59:59-14:00"}  # fmt: skip
    reply = await api.post("/tool-calls", json=late, auth=key, expect=422)
    assert reply.detail.startswith("body.created_at: is out of range")
    reply = await api.post("/tool-calls", json={**late, "created_at": 0.5}, auth=key, expect=422)
    assert reply.detail.startswith("body.created_at:")
    # The edges themselves are timestamps, refused only for lying outside the retention.
    for edge, problem in (
        ("0001-01-01T00:00:00Z", "is older than the tool call retention"),
        ("9999-12-31T23:59:59Z", "is more than 1 hour in the future"),
    ):
        reply = await api.post("/tool-calls", json={**late, "created_at": edge}, auth=key)
        assert reply.status == 422, reply.body
        assert reply.detail.startswith(f"body.created_at: {problem}"), reply.detail
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 0


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
async def test_nan_and_infinity_are_not_json(api: Api, db: asyncpg.Connection, token: str) -> None:
    owner, server_id = await owner_with_server(api, db)
    key = await api.api_key(owner)
    before = await row_counts(db)
    rule = (
        '{"name": "r", "metric": "call_count", "operator": ">", "window_minutes": 5, '
        f'"threshold": {token}}}'
    )
    reply = await api.post("/alerts/rules", data=rule, auth=owner, expect=400)
    assert "NaN and Infinity" in reply.detail
    call = f'{{"server_id": "{server_id}", "tool_name": "t", "status": "success", '
    call += f'"duration_ms": {token}}}'
    await api.post("/tool-calls", data=call, auth=key, expect=400)
    # In a string it is just text.
    named = f'{{"server_id": "{server_id}", "tool_name": "{token}", "status": "success"}}'
    await api.post("/tool-calls", data=named, auth=key, expect=201)
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == before["tool_calls"] + 1


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
async def test_json_sent_as_another_media_type_is_415(
    api: Api, db: asyncpg.Connection, content_type: str | None
) -> None:
    owner, server_id = await owner_with_server(api, db)
    key = await api.api_key(owner)
    headers = {} if content_type is None else {"Content-Type": content_type}
    before = await row_counts(db)
    for path, body, auth in (
        ("/servers", b'{"name": "x", "url": "http://x.example/mcp"}', owner),
        ("/tool-calls", b'{"server_id": "' + server_id.encode() + b'", "tool_name": "t", '
                        b'"status": "success"}', key),
        ("/workspaces", b'{"name": "w"}', owner),
    ):  # fmt: skip
        async with api.client.post(
            f"/api/v1{path}", data=body, headers={**headers, **_auth(auth)}
        ) as response:
            assert response.status == 415, path
            assert "Content-Type: application/json" in (await response.json())["detail"]
    assert await row_counts(db) == before


def _auth(auth: Account | str) -> dict[str, str]:
    return auth.headers if isinstance(auth, Account) else {"X-API-Key": auth}


async def test_options_answered_405_says_what_is_allowed(api: Api) -> None:
    reply = await api.request("OPTIONS", "/servers")
    assert reply.status == 405
    assert set(reply.headers["Allow"].split(",")) == {"GET", "POST"}


async def test_a_fixed_path_segment_is_never_taken_for_an_id(api: Api) -> None:
    """/members/invite is not /members/{user_id}: its Allow lists POST alone, and an id that
    is not hex is unknown before any handler runs."""
    owner = await api.org(await api.signup())
    ws = f"/workspaces/{owner.workspace_id}"
    for method in ("OPTIONS", "DELETE", "PATCH"):
        reply = await api.request(method, f"{ws}/members/invite", auth=owner, expect=405)
        assert reply.headers["Allow"] == "POST"
    await api.delete(f"{ws}/members/not-an-id", auth=owner, expect=404)
    await api.get("/servers/zzz", auth=owner, expect=404)


async def test_a_whole_number_written_with_a_fraction_is_an_integer(
    api: Api, db: asyncpg.Connection
) -> None:
    """JSON has one kind of number: 5.0 is the integer 5, as JSON Schema says; 5.5 is not."""
    owner, server_id = await owner_with_server(api, db)
    rule = {"name": "r", "metric": "call_count", "operator": ">", "threshold": 1}
    created = await api.post(
        "/alerts/rules", json={**rule, "window_minutes": 5.0}, auth=owner, expect=201
    )
    assert created.body["window_minutes"] == 5
    refused = await api.post(
        "/alerts/rules", json={**rule, "window_minutes": 5.5}, auth=owner, expect=422
    )
    assert refused.detail == "body.window_minutes: Input should be a valid integer"
    call = {"server_id": server_id, "tool_name": "t", "status": "success", "duration_ms": 12.0}
    stored = await api.post("/tool-calls", json=call, auth=owner, expect=201)
    assert stored.body["duration_ms"] == 12
    refused = await api.patch(
        f"/alerts/rules/{created.body['id']}", json={"window_minutes": 0.5}, auth=owner
    )
    assert refused.status == 422 and refused.detail.startswith("body.window_minutes:")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://0/mcp", "numeric host that is not a dotted-quad IPv4 address"),
        ("http://127.1/mcp", "numeric host that is not a dotted-quad IPv4 address"),
        ("http://2130706433/mcp", "numeric host that is not a dotted-quad IPv4 address"),
        ("http://10.0.0.010/mcp", "numeric host that is not a dotted-quad IPv4 address"),
        ("http://a..example/mcp", "invalid host name"),
        (f"http://{'a' * 64}.example/mcp", "invalid host name"),
    ],
)
async def test_urls_the_gateway_could_never_dial_are_refused(
    api: Api, db: asyncpg.Connection, url: str, why: str
) -> None:
    owner, _ = await owner_with_server(api, db)
    before = await row_counts(db)
    reply = await api.post("/servers", json={"name": "s", "url": url}, auth=owner, expect=422)
    assert reply.detail.startswith("body.url: ") and why in reply.detail
    rule = {"name": "r", "metric": "call_count", "operator": ">", "threshold": 1}
    rule |= {"window_minutes": 5, "webhook_url": url}
    reply = await api.post("/alerts/rules", json=rule, auth=owner, expect=422)
    assert reply.detail.startswith("body.webhook_url: ") and why in reply.detail
    assert await row_counts(db) == before
    await api.post(
        "/servers", json={"name": "ok", "url": "http://10.0.0.10:8080/mcp"}, auth=owner, expect=201
    )


async def slow_body(port: int, request_line: bytes, headers: bytes) -> bytes:
    """Complete headers, then a tenth of the announced body, then nothing: the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        request_line + b"\r\nHost: gateway\r\nContent-Type: application/json\r\n" + headers
        + b"Content-Length: 100\r\n\r\n" + b'{"name": "'
    )  # fmt: skip
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(65536), 20)  # the answer, in one piece
    finally:
        writer.close()


async def test_a_body_that_does_not_arrive_is_408(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_api(body_timeout_seconds=0.3)
    owner, server_id = await owner_with_server(api, db)
    port = api.client.port
    assert port is not None
    auth = f"Authorization: Bearer {owner.access_token}\r\n".encode()
    for request_line in (
        b"POST /api/v1/servers HTTP/1.1",
        b"POST /api/v1/tool-calls HTTP/1.1",
        b"POST /api/v1/proxy/" + server_id.encode() + b"/mcp HTTP/1.1",
        b"POST /login HTTP/1.1",
    ):
        answer = await slow_body(port, request_line, auth)
        assert answer.startswith(b"HTTP/1.1 408"), (request_line, answer[:100])
        assert b"did not arrive within 0.3 s" in answer
