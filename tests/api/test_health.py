"""/health: the checks list (filters, pagination) and the uptime summary, against brute force."""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from gateway.db import health_checks as health_checks_db
from gateway.mcp.probe import ProbeResult
from tests.helpers.api import Account, Api


async def register(api: Api, admin: Account, name: str) -> uuid.UUID:
    body = {"name": name, "url": "http://127.0.0.1:9/mcp"}
    reply = await api.post("/servers", json=body, auth=admin, expect=201)
    return uuid.UUID(reply.body["id"])


async def add_check(
    db: asyncpg.Connection,
    server_id: uuid.UUID,
    status: str,
    latency_ms: float,
    checked_at: datetime | None = None,
) -> dict[str, Any]:
    error = None if status == "healthy" else f"{status} for a test"
    result = ProbeResult(status, latency_ms, error, None, None)
    check = await health_checks_db.record(db, server_id, result, checked_at=checked_at)
    assert check is not None
    return check


def _json(check: dict[str, Any]) -> dict[str, Any]:
    return {
        **check,
        "id": str(check["id"]),
        "server_id": str(check["server_id"]),
        "checked_at": check["checked_at"].isoformat(),
    }


async def test_checks_newest_first_with_filters_and_pages(api: Api, db: asyncpg.Connection) -> None:
    admin = await api.signup()
    first = await register(api, admin, "first")
    second = await register(api, admin, "second")
    now: datetime = await db.fetchval("SELECT now()")
    statuses = ["healthy", "down", "degraded", "healthy", "down", "healthy", "healthy"]
    stored = []
    for i, status in enumerate(statuses):
        server = first if i % 2 == 0 else second
        when = now - timedelta(minutes=10 * (len(statuses) - i))
        stored.append(await add_check(db, server, status, 10.0 * i, when))
    newest_first = [_json(c) for c in reversed(stored)]

    async def page(**params: Any) -> dict[str, Any]:
        reply = await api.get("/health/checks", params=params, auth=admin, expect=200)
        body: dict[str, Any] = reply.body
        return body

    assert await page() == {"items": newest_first, "total": 7}
    assert await page(limit=3) == {"items": newest_first[:3], "total": 7}
    assert await page(limit=3, offset=6) == {"items": newest_first[6:], "total": 7}
    assert await page(offset=10) == {"items": [], "total": 7}
    by_first = [c for c in newest_first if c["server_id"] == str(first)]
    assert await page(server_id=str(first)) == {"items": by_first, "total": 4}
    down = [c for c in newest_first if c["status"] == "down"]
    assert await page(status="down") == {"items": down, "total": 2}
    second_down = [c for c in down if c["server_id"] == str(second)]
    assert len(second_down) == 1
    assert await page(status="down", server_id=str(second)) == {"items": second_down, "total": 1}
    assert await page(status="degraded", server_id=str(second)) == {"items": [], "total": 0}
    assert await page(server_id=str(uuid.uuid4())) == {"items": [], "total": 0}

    for params, field in [
        ({"limit": 201}, "query.limit"),
        ({"limit": 0}, "query.limit"),
        ({"limit": "ten"}, "query.limit"),
        ({"offset": -1}, "query.offset"),
        ({"status": "unknown"}, "query.status"),
        ({"server_id": "nope"}, "query.server_id"),
    ]:
        reply = await api.get("/health/checks", params=params, auth=admin, expect=422)
        assert reply.detail.startswith(f"{field}:"), reply.detail
    assert (await page(limit=200))["total"] == 7


async def test_summary_matches_brute_force(api: Api, db: asyncpg.Connection) -> None:
    """Random checks over 40 days; every window must equal a direct count of the rows."""
    admin = await api.signup()
    servers = [await register(api, admin, name) for name in ("alpha", "bravo", "charlie")]
    never = await register(api, admin, "delta")
    now: datetime = await db.fetchval("SELECT now()")
    rng = random.Random(7)
    rows: list[tuple[uuid.UUID, str, float, datetime]] = []
    for _ in range(300):
        server = rng.choice(servers[:2])
        age = timedelta(seconds=rng.uniform(0, 40 * 86400))
        # Keep clear of the window edges, which move while the test runs.
        if any(abs(age - timedelta(days=d)) < timedelta(minutes=2) for d in (1, 7, 30)):
            continue
        status = rng.choice(["healthy", "healthy", "healthy", "degraded", "down"])
        latency = round(rng.uniform(1, 3000), 3)
        rows.append((server, status, latency, now - age))
    # Some in the current hour and right at its start, where the rollups stop.
    this_hour = now.replace(minute=0, second=0, microsecond=0)
    for server, status, when in [
        (servers[0], "healthy", now - timedelta(seconds=1)),
        (servers[1], "down", this_hour),
        (servers[1], "healthy", this_hour - timedelta(microseconds=1)),
    ]:
        rows.append((server, status, 42.5, when))
    # The last server's only check is older than every window but 60 days.
    rows.append((servers[2], "healthy", 5.0, now - timedelta(days=45)))
    for server, status, latency, when in rows:
        await add_check(db, server, status, latency, when)

    for days in (1, 7, 30, 60):
        since = now - timedelta(days=days)
        expected = []
        names = ["alpha", "bravo", "charlie", "delta"]
        for server, name in zip([*servers, never], names, strict=True):
            mine = [r for r in rows if r[0] == server]
            window = [r for r in mine if r[3] >= since]
            healthy = sum(1 for r in window if r[1] == "healthy")
            last = max((r[3] for r in mine), default=None)
            expected.append(
                {
                    "server_id": str(server),
                    "server_name": name,
                    "uptime_percent": round(100 * healthy / len(window), 2) if window else None,
                    "total_checks": len(window),
                    "healthy_checks": healthy,
                    "avg_latency_ms": (
                        round(sum(r[2] for r in window) / len(window), 2) if window else None
                    ),
                    "last_checked_at": last.isoformat() if last else None,
                }
            )
        params = {} if days == 30 else {"days": days}
        reply = await api.get("/health/summary", params=params, auth=admin, expect=200)
        assert reply.body == expected, days


async def test_summary_rounding_and_limits(api: Api, db: asyncpg.Connection) -> None:
    admin = await api.signup()
    server = await register(api, admin, "only")
    for status, latency in [("healthy", 100.0), ("healthy", 200.0), ("degraded", 400.5)]:
        await add_check(db, server, status, latency)
    reply = await api.get("/health/summary", auth=admin, expect=200)
    (item,) = reply.body
    assert item["uptime_percent"] == 66.67
    assert item["avg_latency_ms"] == 233.5
    assert (item["total_checks"], item["healthy_checks"]) == (3, 2)
    for days in ("0", "366", "week"):
        reply = await api.get("/health/summary", params={"days": days}, auth=admin, expect=422)
        assert reply.detail.startswith("query.days:")
    await api.get("/health/summary", params={"days": "365"}, auth=admin, expect=200)


async def test_reads_for_members_and_api_keys_within_their_workspace(
    api: Api, db: asyncpg.Connection
) -> None:
    owner = await api.org(await api.signup())
    member = await api.member(owner, "member")
    key = await api.api_key(owner)
    server = await register(api, owner, "mine")
    check = await add_check(db, server, "down", 12.0)
    stranger = await api.signup()
    theirs = await register(api, stranger, "theirs")
    await add_check(db, theirs, "healthy", 1.0)

    for caller in (owner, member, key):
        checks = await api.get("/health/checks", auth=caller, expect=200)
        assert checks.body == {"items": [_json(check)], "total": 1}
        summary = await api.get("/health/summary", auth=caller, expect=200)
        assert [s["server_name"] for s in summary.body] == ["mine"]
    # a server of another workspace is only a filter that matches nothing
    reply = await api.get(
        "/health/checks", params={"server_id": str(theirs)}, auth=owner, expect=200
    )
    assert reply.body == {"items": [], "total": 0}
    await api.get("/health/checks", expect=401)
    await api.get("/health/summary", expect=401)
    await api.get("/health/checks", auth="mcpg_" + "x" * 43, expect=401)
