"""/tool-calls: direct ingestion (single and arrays) and the filtered, exactly counted list."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from gateway.calllog.records import ToolCall, new_call_id
from gateway.db import tool_calls as tool_calls_db
from gateway.db.partitions import floor_day
from gateway.db.rollups import floor_hour
from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.proxying import add_server
from tests.helpers.toolset_calls import add_toolset, write_calls


async def workspace_with_server(api: Api, db: asyncpg.Connection) -> tuple[Account, str, str]:
    owner = await api.signup()
    key = await api.api_key(owner)
    server_id = await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    return owner, key, server_id


def tool_call(server_id: str, **fields: Any) -> dict[str, Any]:
    return {"server_id": server_id, "tool_name": "search", "status": "success", **fields}


async def test_ingest_one_then_read_it(api: Api, db: asyncpg.Connection) -> None:
    owner, key, server_id = await workspace_with_server(api, db)
    before = datetime.now(UTC)
    body = tool_call(
        server_id,
        caller_agent="agent-1",
        duration_ms=120,
        input_tokens=10,
        output_tokens=20,
        output_size_bytes=2048,
        error_message=None,
        ignored_field="x",
        # Only the gateway's toolset endpoint knows which calls came through a toolset.
        toolset_id=str(uuid.uuid4()),
    )
    created = (await api.post("/tool-calls", json=body, auth=key, expect=201)).body
    server_name = await db.fetchval("SELECT name FROM servers WHERE id = $1", uuid.UUID(server_id))
    assert created == {
        "id": created["id"],
        "server_id": server_id,
        "server_name": server_name,
        "tool_name": "search",
        "caller_agent": "agent-1",
        "status": "success",
        "duration_ms": 120,
        "input_tokens": 10,
        "output_tokens": 20,
        "output_size_bytes": 2048,
        "error_message": None,
        "created_at": created["created_at"],
        "toolset_id": None,
        "trace_id": None,
    }
    assert await db.fetchval("SELECT toolset_id FROM tool_calls") is None
    assert before <= datetime.fromisoformat(created["created_at"]) <= datetime.now(UTC)
    # Committed before the 201: read right away, with a token as well as with the key.
    for auth in (key, owner):
        listed = await api.get("/tool-calls", auth=auth, expect=200)
        assert listed.body == {"items": [created], "total": 1}


async def test_ingest_arrays_up_to_1000(api: Api, db: asyncpg.Connection) -> None:
    owner, key, server_id = await workspace_with_server(api, db)
    member = await api.member(owner, "member")
    body = [tool_call(server_id, tool_name=f"tool-{i % 10}", duration_ms=i) for i in range(1000)]
    created = await api.post("/tool-calls", json=body, auth=member, expect=201)
    assert [item["duration_ms"] for item in created.body["items"]] == list(range(1000))
    listed = await api.get("/tool-calls", params={"limit": 200}, auth=key, expect=200)
    assert listed.body["total"] == 1000
    assert len(listed.body["items"]) == 200
    assert await db.fetchval("SELECT sum(call_count) FROM tool_call_hourly") == 1000
    reply = await api.post("/tool-calls", json=[*body, tool_call(server_id)], auth=key, expect=422)
    assert "at most 1000" in reply.detail
    await api.post("/tool-calls", json=[], auth=key, expect=422)


async def test_ingest_validation(api: Api, db: asyncpg.Connection) -> None:
    _, key, server_id = await workspace_with_server(api, db)
    missing = {"server_id": server_id, "status": "success"}
    assert (await api.post("/tool-calls", json=missing, auth=key, expect=422)).detail == (
        "body.tool_name: Field required"
    )
    batch = [tool_call(server_id), tool_call(server_id, status="ok")]
    reply = await api.post("/tool-calls", json=batch, auth=key, expect=422)
    assert reply.detail.startswith("body.1.status:")
    for field, value in [
        ("duration_ms", "5"),
        ("duration_ms", -1),
        ("server_id", "nope"),
        ("created_at", "yesterday"),
        ("tool_name", ""),
        ("tool_name", "t" * 256),
        # Indexed: 256 CJK characters would come near PostgreSQL's bound on an index entry.
        ("caller_agent", "漢" * 256),
        # A W3C trace id: 32 lowercase hex digits, not all zeros.
        ("trace_id", "0af7651916cd43dd8448eb211c80319"),
        ("trace_id", "0AF7651916CD43DD8448EB211C80319C"),
        ("trace_id", "0" * 32),
        ("trace_id", 42),
    ]:
        body = {**tool_call(server_id), field: value}
        reply = await api.post("/tool-calls", json=body, auth=key, expect=422)
        assert reply.detail.startswith(f"body.{field}:"), reply.detail
    await api.post("/tool-calls", data="{not json", auth=key, expect=400)
    await api.post("/tool-calls", data="42", auth=key, expect=400)
    await api.post("/tool-calls", data="", auth=key, expect=400)
    await api.post("/tool-calls", json=tool_call(server_id), expect=401)
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 0


async def test_an_ingested_call_keeps_its_trace_id(api: Api, db: asyncpg.Connection) -> None:
    """A client that traces its agent links each call it reports to its trace."""
    _, key, server_id = await workspace_with_server(api, db)
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    created = (
        await api.post("/tool-calls", json=tool_call(server_id, trace_id=trace_id), auth=key)
    ).body
    assert created["trace_id"] == trace_id
    listed = await api.get("/tool-calls", auth=key, expect=200)
    assert [item["trace_id"] for item in listed.body["items"]] == [trace_id]
    assert await db.fetchval("SELECT trace_id FROM tool_calls") == trace_id


async def test_ingest_only_into_own_servers(api: Api, db: asyncpg.Connection) -> None:
    _, key, server_id = await workspace_with_server(api, db)
    _, other_key, other_server = await workspace_with_server(api, db)
    batch = [tool_call(server_id), tool_call(other_server)]
    reply = await api.post("/tool-calls", json=batch, auth=key, expect=404)
    assert reply.detail == f"server {other_server} not found"
    await api.post("/tool-calls", json=tool_call(str(uuid.uuid4())), auth=key, expect=404)
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 0
    await api.post("/tool-calls", json=tool_call(other_server), auth=other_key, expect=201)
    assert (await api.get("/tool-calls", auth=key, expect=200)).body == {"items": [], "total": 0}


async def test_created_at_may_be_supplied(api: Api, db: asyncpg.Connection) -> None:
    _, key, server_id = await workspace_with_server(api, db)
    day = floor_day(datetime.now(UTC)) - timedelta(days=3)
    old = tool_call(server_id, created_at=f"{day:%Y-%m-%d}T03:04:05.678+02:00")
    naive = tool_call(server_id, created_at=f"{day:%Y-%m-%d}T03:04:05")
    created = await api.post("/tool-calls", json=[old, naive], auth=key, expect=201)
    stamps = [datetime.fromisoformat(item["created_at"]) for item in created.body["items"]]
    assert stamps == [
        day + timedelta(hours=1, minutes=4, seconds=5, milliseconds=678),
        day + timedelta(hours=3, minutes=4, seconds=5),
    ]
    hours = await db.fetch("SELECT hour FROM tool_call_hourly ORDER BY hour")
    assert [r["hour"] for r in hours] == [day + timedelta(hours=1), day + timedelta(hours=3)]


async def test_created_at_within_the_retention_and_at_most_an_hour_ahead(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    """Every created_at accepted has a partition to go to and stays until its day expires: older
    than GATEWAY_TOOL_CALL_RETENTION_DAYS, or more than an hour ahead, is a 422 naming the
    field, and nothing of the request is stored."""
    api = await make_api(tool_call_retention_days=2)
    _, key, server_id = await workspace_with_server(api, db)
    now = datetime.now(UTC)
    kept = [
        tool_call(server_id, created_at=iso(now - timedelta(days=2) + timedelta(minutes=1))),
        tool_call(server_id, created_at=iso(now + timedelta(minutes=59))),
        tool_call(server_id),
    ]
    too_old = tool_call(server_id, created_at=iso(now - timedelta(days=2, minutes=1)))
    too_new = tool_call(server_id, created_at=iso(now + timedelta(minutes=61)))
    reply = await api.post("/tool-calls", json=too_old, auth=key, expect=422)
    assert reply.detail == (
        "body.created_at: is older than the tool call retention (2 days): "
        "such calls are no longer kept"
    )
    reply = await api.post("/tool-calls", json=[*kept, too_new], auth=key, expect=422)
    assert reply.detail == "body.3.created_at: is more than 1 hour in the future"
    reply = await api.post("/tool-calls", json=[*kept[:1], too_old], auth=key, expect=422)
    assert reply.detail.startswith("body.1.created_at: is older than the tool call retention")
    assert await db.fetchval("SELECT count(*) FROM tool_calls") == 0

    created = await api.post("/tool-calls", json=kept, auth=key, expect=201)
    listed = await api.get("/tool-calls", auth=key, expect=200)
    newest_first = sorted(created.body["items"], key=lambda c: c["created_at"], reverse=True)
    assert [c["id"] for c in listed.body["items"]] == [c["id"] for c in newest_first]
    assert listed.body["total"] == 3
    # The document says so, where clients read what created_at takes.
    document = await api.get("/openapi.json", expect=200)
    described = json.dumps(document.body)
    assert "GATEWAY_TOOL_CALL_RETENTION_DAYS" in described
    assert "at most 1 hour ahead" in described


async def test_only_calls_within_the_retention_are_listed_and_counted(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    """Calls older than the retention may still be stored until their day's partition goes,
    while their rollups stay for long after: the list and its total leave both out alike, from
    the start of the hour the retention reaches back to."""
    api = await make_api(tool_call_retention_days=3)
    owner, key, server_id = await workspace_with_server(api, db)
    now = datetime.now(UTC)
    kept_since = floor_hour(now - timedelta(days=3))
    ages = [timedelta(days=5), timedelta(days=3, hours=2), timedelta(days=1), timedelta(0)]
    ages += [now - kept_since - timedelta(seconds=1)]  # the oldest listed: in the first hour
    calls = [
        ToolCall(
            id=new_call_id(),
            workspace_id=uuid.UUID(owner.workspace_id),
            server_id=uuid.UUID(server_id),
            tool_name="search" if i % 2 else "fetch",
            caller_agent=None,
            status="error" if i % 3 == 0 else "success",
            duration_ms=5,
            input_tokens=None,
            output_tokens=None,
            output_size_bytes=None,
            error_message=None,
            created_at=now - age,
        )
        for i, age in enumerate(ages * 60)
    ]
    # Written as the proxy's would have been when they were new.
    assert await tool_calls_db.write_batch(db, calls) == len(calls)
    listed = [c for c in calls if c.created_at >= kept_since]
    assert len(listed) == 3 * 60
    for params in [
        {},
        {"start": iso(now - timedelta(days=10))},
        {"status": "error"},
        {"tool_name": "sea"},
        {"server_id": server_id, "end": iso(now - timedelta(hours=1))},
    ]:
        expected = [
            c
            for c in listed
            if ("status" not in params or c.status == params["status"])
            and ("tool_name" not in params or c.tool_name == "search")
            and ("end" not in params or c.created_at <= now - timedelta(hours=1))
        ]
        reply = await api.get("/tool-calls", params={**params, "limit": 200}, auth=key)
        assert reply.status == 200, reply.body
        assert reply.body["total"] == len(expected), params
        assert sorted(item["id"] for item in reply.body["items"]) == sorted(
            str(c.id) for c in expected
        ), params
    reply = await api.get("/tool-calls", params={"end": iso(kept_since)}, auth=key, expect=200)
    assert reply.body == {"items": [], "total": 0}


async def test_list_filters_order_and_pages(api: Api, db: asyncpg.Connection) -> None:
    owner, key, server_id = await workspace_with_server(api, db)
    other_server = await add_server(api, db, owner, "http://127.0.0.1:9/other")
    base = floor_day(datetime.now(UTC)) - timedelta(days=2) + timedelta(hours=12)
    body = [
        tool_call(server_id, tool_name="Search_Docs", caller_agent="a", created_at=iso(base)),
        tool_call(
            server_id,
            tool_name="fetch",
            status="error",
            error_message="boom",
            created_at=iso(base + timedelta(minutes=1)),
        ),
        tool_call(
            other_server,
            tool_name="search%",
            caller_agent="b",
            created_at=iso(base + timedelta(minutes=2)),
        ),
        tool_call(other_server, tool_name="research", created_at=iso(base + timedelta(minutes=3))),
    ]
    await api.post("/tool-calls", json=body, auth=key, expect=201)

    async def names(**params: Any) -> tuple[list[str], int]:
        reply = await api.get("/tool-calls", params=params, auth=key, expect=200)
        return [item["tool_name"] for item in reply.body["items"]], reply.body["total"]

    assert await names() == (["research", "search%", "fetch", "Search_Docs"], 4)
    assert await names(server_id=server_id) == (["fetch", "Search_Docs"], 2)
    assert await names(tool_name="SEARCH") == (["research", "search%", "Search_Docs"], 3)
    assert await names(tool_name="h%") == (["search%"], 1)  # % is literal
    assert await names(tool_name="_") == (["Search_Docs"], 1)
    assert await names(tool_name="nothing") == ([], 0)
    assert await names(caller_agent="b") == (["search%"], 1)
    assert await names(status="error") == (["fetch"], 1)
    assert await names(status="success", server_id=other_server) == (["research", "search%"], 2)
    start, end = iso(base + timedelta(minutes=1)), iso(base + timedelta(minutes=2))
    assert await names(start=start, end=end) == (["search%", "fetch"], 2)
    assert await names(limit=1, offset=1) == (["search%"], 4)
    assert await names(limit=2, offset=1, tool_name="search") == (["search%", "Search_Docs"], 3)
    for bad in ({"limit": 201}, {"limit": 0}, {"offset": -1}, {"status": "ok"}, {"start": "x"}):
        reply = await api.get("/tool-calls", params=bad, auth=key, expect=422)
        assert reply.detail.startswith(f"query.{next(iter(bad))}"), reply.detail
    reply = await api.get("/tool-calls", params={"start": end, "end": start}, auth=key, expect=422)
    assert "end must not be before start" in reply.detail
    await api.get("/tool-calls", params={"server_id": "x"}, auth=key, expect=422)


def iso(moment: datetime) -> str:
    return moment.isoformat()


Check = Callable[[dict[str, Any]], bool]


def equals(field: str, value: Any) -> Check:
    return lambda call: call.get(field) == value


def tool_name_contains(needle: str) -> Check:
    return lambda call: needle.lower() in call["tool_name"].lower()


def not_before(moment: datetime) -> Check:
    return lambda call: datetime.fromisoformat(call["created_at"]) >= moment


def not_after(moment: datetime) -> Check:
    return lambda call: datetime.fromisoformat(call["created_at"]) <= moment


def add_filters(
    rng: random.Random, params: dict[str, Any], conditions: list[Check], servers: list[str]
) -> None:
    """Maybe a status, a tool name substring and a server filter: as query parameters, and as
    the conditions a matching call meets."""
    if rng.random() < 0.4:
        params["status"] = rng.choice(["success", "error"])
        conditions.append(equals("status", params["status"]))
    if rng.random() < 0.4:
        needle = rng.choice(["alpha", "BET", "a"])
        params["tool_name"] = needle
        conditions.append(tool_name_contains(needle))
    if rng.random() < 0.4:
        params["server_id"] = rng.choice(servers)
        conditions.append(equals("server_id", params["server_id"]))


async def assert_total(
    api: Api, key: str, body: list[dict[str, Any]], params: dict[str, Any], conditions: list[Check]
) -> None:
    """GET /tool-calls counts exactly the ingested calls that meet every condition."""
    expected = sum(all(check(c) for check in conditions) for c in body)
    reply = await api.get("/tool-calls", params=params, auth=key, expect=200)
    assert reply.body["total"] == expected, params


async def test_total_is_exact_over_hours(api: Api, db: asyncpg.Connection) -> None:
    """Totals add rollups for whole hours and rows for the partial ones: check against rows."""
    owner, key, server_id = await workspace_with_server(api, db)
    other_server = await add_server(api, db, owner, "http://127.0.0.1:9/other")
    rng = random.Random(11)
    base = floor_day(datetime.now(UTC)) - timedelta(days=3)
    body = [
        tool_call(
            rng.choice([server_id, other_server]),
            tool_name=rng.choice(["alpha", "beta", "alphabet"]),
            status=rng.choice(["success", "error"]),
            caller_agent=rng.choice([None, "x"]),
            created_at=iso(base + timedelta(seconds=rng.randrange(6 * 3600))),
        )
        for _ in range(600)
    ]
    await api.post("/tool-calls", json=body, auth=key, expect=201)
    for _ in range(25):
        params: dict[str, Any] = {"limit": 1}
        conditions: list[Check] = []
        if rng.random() < 0.7:
            start = base + timedelta(seconds=rng.randrange(-600, 6 * 3600))
            params["start"] = iso(start)
            conditions.append(not_before(start))
        if rng.random() < 0.7:
            end = base + timedelta(seconds=rng.randrange(0, 7 * 3600))
            if "start" in params and end < datetime.fromisoformat(params["start"]):
                end = datetime.fromisoformat(params["start"]) + timedelta(minutes=30)
            params["end"] = iso(end)
            conditions.append(not_after(end))
        add_filters(rng, params, conditions, [server_id, other_server])
        if rng.random() < 0.2:
            params["caller_agent"] = "x"
            conditions.append(equals("caller_agent", "x"))
        await assert_total(api, key, body, params, conditions)


async def test_caller_agent_totals_are_exact(api: Api, db: asyncpg.Connection) -> None:
    """caller_agent totals add tool_call_caller_hourly for whole hours and rows for the partial
    ones, combined with every other filter: check against rows."""
    owner, key, server_id = await workspace_with_server(api, db)
    other_server = await add_server(api, db, owner, "http://127.0.0.1:9/other")
    rng = random.Random(12)
    base = floor_day(datetime.now(UTC)) - timedelta(days=4)
    callers = ["planner", "coder", "Coder"]
    body = [
        tool_call(
            rng.choice([server_id, other_server]),
            tool_name=rng.choice(["alpha", "beta", "alphabet"]),
            status=rng.choice(["success", "error"]),
            caller_agent=rng.choice([None, *callers]),
            created_at=iso(base + timedelta(seconds=rng.randrange(8 * 3600))),
        )
        for _ in range(900)
    ]
    await api.post("/tool-calls", json=body, auth=key, expect=201)
    # The rollup holds the counts of every (caller, server, tool, hour) with a caller.
    expected_rows: dict[tuple[str, str, str, datetime], list[int]] = {}
    for c in body:
        if c["caller_agent"] is not None:
            at = datetime.fromisoformat(c["created_at"]).replace(minute=0, second=0)
            counts = expected_rows.setdefault(
                (c["caller_agent"], c["server_id"], c["tool_name"], at), [0, 0]
            )
            counts[0] += 1
            counts[1] += c["status"] == "error"
    rows = await db.fetch("SELECT * FROM tool_call_caller_hourly")
    assert {
        (r["caller_agent"], str(r["server_id"]), r["tool_name"], r["hour"]): [
            r["call_count"],
            r["error_count"],
        ]
        for r in rows
    } == expected_rows

    for i in range(40):
        caller = rng.choice([*callers, "nobody"])
        params: dict[str, Any] = {"limit": 1, "caller_agent": caller}
        conditions = [equals("caller_agent", caller)]
        if i % 2 or rng.random() < 0.5:  # never on a whole hour, mostly
            start = base + timedelta(seconds=rng.randrange(-600, 8 * 3600))
            params["start"] = iso(start)
            conditions.append(not_before(start))
        if i % 3 == 0 or rng.random() < 0.5:
            low = datetime.fromisoformat(params.get("start", iso(base)))
            end = low + timedelta(seconds=rng.randrange(0, 9 * 3600))
            params["end"] = iso(end)
            conditions.append(not_after(end))
        add_filters(rng, params, conditions, [server_id, other_server])
        await assert_total(api, key, body, params, conditions)

    # Whole hours are read from the rollup, not counted row by row.
    await db.execute("UPDATE tool_call_caller_hourly SET call_count = call_count + 1")
    params = {"limit": 1, "caller_agent": "coder"}
    reply = await api.get("/tool-calls", params=params, auth=key, expect=200)
    coder = sum(c["caller_agent"] == "coder" for c in body)
    assert reply.body["total"] == coder + sum(k[0] == "coder" for k in expected_rows)


def is_refusal(call: dict[str, Any]) -> bool:
    return call["status"] == "error" and (call.get("error_message") or "").startswith("refused:")


def refusal_is(refused: bool) -> Check:
    return lambda call: is_refusal(call) == refused


async def test_the_refused_filter_lists_and_counts_refusals_exactly(
    api: Api, db: asyncpg.Connection
) -> None:
    """Refusals are error rows whose message starts 'refused:'; the rollups do not know them,
    so their totals (and those of everything but them) must still match the rows."""
    owner, key, server_id = await workspace_with_server(api, db)
    other_server = await add_server(api, db, owner, "http://127.0.0.1:9/other")
    rng = random.Random(13)
    base = floor_day(datetime.now(UTC)) - timedelta(days=2)
    kinds: list[dict[str, Any]] = [
        {"status": "success"},
        {"status": "error", "error_message": "boom"},
        {"status": "error"},  # no message: not a refusal
        {"status": "error", "error_message": "refused: tool read_x is disabled"},
        {"status": "error", "error_message": "not refused: a message that only says it"},
        {"status": "success", "error_message": "refused: but a success is no refusal"},
    ]
    body = [
        tool_call(
            rng.choice([server_id, other_server]),
            tool_name=rng.choice(["alpha", "beta", "alphabet"]),
            created_at=iso(base + timedelta(seconds=rng.randrange(5 * 3600))),
            **rng.choice(kinds),
        )
        for _ in range(500)
    ]
    await api.post("/tool-calls", json=body, auth=key, expect=201)
    refusals = [c for c in body if is_refusal(c)]
    assert 0 < len(refusals) < len(body)

    reply = await api.get("/tool-calls", params={"refused": "true"}, auth=key, expect=200)
    assert reply.body["total"] == len(refusals)
    assert all(item["error_message"].startswith("refused:") for item in reply.body["items"])
    assert len(reply.body["items"]) == min(50, len(refusals))
    reply = await api.get("/tool-calls", params={"refused": "false"}, auth=key, expect=200)
    assert reply.body["total"] == len(body) - len(refusals)
    assert not any(is_refusal(item) for item in reply.body["items"])

    for _ in range(30):
        refused = rng.choice([True, False])
        params: dict[str, Any] = {"limit": 1, "refused": str(refused).lower()}
        conditions: list[Check] = [refusal_is(refused)]
        if rng.random() < 0.6:
            start = base + timedelta(seconds=rng.randrange(-600, 5 * 3600))
            params["start"] = iso(start)
            conditions.append(not_before(start))
        if rng.random() < 0.6:
            low = datetime.fromisoformat(params.get("start", iso(base)))
            end = low + timedelta(seconds=rng.randrange(0, 6 * 3600))
            params["end"] = iso(end)
            conditions.append(not_after(end))
        add_filters(rng, params, conditions, [server_id, other_server])
        await assert_total(api, key, body, params, conditions)

    reply = await api.get("/tool-calls", params={"refused": "maybe"}, auth=key, expect=422)
    assert reply.detail.startswith("query.refused"), reply.detail


async def test_a_refusal_of_the_gateway_is_found_by_the_refused_filter(
    api: Api, db: asyncpg.Connection
) -> None:
    owner, key, server_id = await workspace_with_server(api, db)
    await api.patch(
        f"/servers/{server_id}", json={"disabled_tools": ["danger_*"]}, auth=owner, expect=200
    )
    await api.post("/tool-calls", json=tool_call(server_id), auth=key, expect=201)
    reply = await api.post(
        f"/servers/{server_id}/tools/invoke",
        json={"tool_name": "danger_drop", "arguments": {}},
        auth=owner,
        expect=403,
    )
    reply = await api.get("/tool-calls", params={"refused": "true"}, auth=key, expect=200)
    [refusal] = reply.body["items"]
    assert refusal["tool_name"] == "danger_drop" and refusal["status"] == "error"
    assert refusal["error_message"].startswith("refused:")
    assert reply.body["total"] == 1
    reply = await api.get("/tool-calls", params={"refused": "false"}, auth=key, expect=200)
    assert [item["tool_name"] for item in reply.body["items"]] == ["search"]


async def test_the_toolset_filter_lists_and_counts_the_calls_through_it_exactly(
    api: Api, db: asyncpg.Connection
) -> None:
    """Calls through toolsets, written by the call log as the toolset endpoint writes them:
    each item says its toolset (null for the others), and `toolset_id` keeps exactly the
    calls through that toolset, with every other filter, over whole and partial hours."""
    owner, key, server_id = await workspace_with_server(api, db)
    other_server = await add_server(api, db, owner, "http://127.0.0.1:9/other")
    servers = [server_id, other_server]
    research = await add_toolset(db, owner.workspace_id, "research", servers)
    ops = await add_toolset(db, owner.workspace_id, "ops", [server_id])
    rng = random.Random(14)
    base = floor_day(datetime.now(UTC)) - timedelta(days=2)
    body = [
        tool_call(
            rng.choice(servers),
            tool_name=rng.choice(["alpha", "beta", "alphabet"]),
            status=rng.choice(["success", "error"]),
            caller_agent=rng.choice([None, "x"]),
            created_at=iso(base + timedelta(seconds=rng.randrange(6 * 3600))),
            toolset_id=rng.choice([None, research, ops]),
        )
        for _ in range(600)
    ]
    records = await write_calls(api, owner.workspace_id, body)

    newest_first = sorted(records, key=lambda r: (r.created_at, r.id), reverse=True)
    for toolset in (research, ops):
        reply = await api.get(
            "/tool-calls", params={"toolset_id": toolset, "limit": 200}, auth=key, expect=200
        )
        expected = [r for r in newest_first if str(r.toolset_id) == toolset]
        assert 0 < reply.body["total"] == len(expected)
        assert [item["id"] for item in reply.body["items"]] == [str(r.id) for r in expected][:200]
        assert {item["toolset_id"] for item in reply.body["items"]} == {toolset}
    listed = await api.get("/tool-calls", params={"limit": 200}, auth=key, expect=200)
    toolset_of = {str(r.id): None if r.toolset_id is None else str(r.toolset_id) for r in records}
    assert all(item["toolset_id"] == toolset_of[item["id"]] for item in listed.body["items"])
    assert {item["toolset_id"] for item in listed.body["items"]} == {None, research, ops}

    for _ in range(30):
        toolset = rng.choice([research, ops])
        params: dict[str, Any] = {"limit": 1, "toolset_id": toolset}
        conditions: list[Check] = [equals("toolset_id", toolset)]
        if rng.random() < 0.6:
            start = base + timedelta(seconds=rng.randrange(-600, 6 * 3600))
            params["start"] = iso(start)
            conditions.append(not_before(start))
        if rng.random() < 0.6:
            low = datetime.fromisoformat(params.get("start", iso(base)))
            end = low + timedelta(seconds=rng.randrange(0, 7 * 3600))
            params["end"] = iso(end)
            conditions.append(not_after(end))
        add_filters(rng, params, conditions, servers)
        if rng.random() < 0.3:
            params["caller_agent"] = "x"
            conditions.append(equals("caller_agent", "x"))
        await assert_total(api, key, body, params, conditions)

    # A toolset of another workspace, or none at all, matches nothing; a malformed id is 422.
    other, _, _ = await workspace_with_server(api, db)
    theirs = await add_toolset(db, other.workspace_id, "research")
    for toolset in (theirs, str(uuid.uuid4())):
        reply = await api.get("/tool-calls", params={"toolset_id": toolset}, auth=key, expect=200)
        assert reply.body == {"items": [], "total": 0}
    reply = await api.get("/tool-calls", params={"toolset_id": "x"}, auth=key, expect=422)
    assert reply.detail.startswith("query.toolset_id"), reply.detail
