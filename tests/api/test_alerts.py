"""/alerts: rules CRUD and validation, events and deliveries listing, roles and tenancy."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from tests.helpers.alerting import add_rule, add_server, ago, evaluate, events, ingest
from tests.helpers.api import Api

RULE_FIELDS = {
    "id",
    "name",
    "server_id",
    "metric",
    "operator",
    "threshold",
    "window_minutes",
    "slack_webhook_url",
    "webhook_url",
    "enabled",
    "created_at",
    "updated_at",
}


async def test_rule_crud(api: Api) -> None:
    owner = await api.signup()
    server_id = await add_server(api, owner, "billing")
    created = await api.post(
        "/alerts/rules",
        json={
            "name": "Errors",
            "server_id": server_id,
            "metric": "error_rate",
            "operator": ">=",
            "threshold": 0.5,
            "window_minutes": 15,
            "webhook_url": "https://hooks.example.com/a",
            "unknown_field": "ignored",
        },
        auth=owner,
        expect=201,
    )
    rule = created.body
    assert set(rule) == RULE_FIELDS
    assert rule["server_id"] == server_id
    assert rule["enabled"] is True
    assert rule["slack_webhook_url"] is None
    assert rule["threshold"] == 0.5

    listed = await api.get("/alerts/rules", auth=owner, expect=200)
    assert [r["id"] for r in listed.body] == [rule["id"]]
    one = await api.get(f"/alerts/rules/{rule['id']}", auth=owner, expect=200)
    assert one.body == rule

    # Only what is sent changes; a nullable field may be cleared with null.
    patched = await api.patch(
        f"/alerts/rules/{rule['id']}",
        json={"threshold": 3, "webhook_url": None, "slack_webhook_url": "http://slack.test/x"},
        auth=owner,
        expect=200,
    )
    assert patched.body["threshold"] == 3
    assert patched.body["webhook_url"] is None
    assert patched.body["slack_webhook_url"] == "http://slack.test/x"
    unchanged = {"name", "server_id", "metric", "operator", "window_minutes", "enabled"}
    assert {k: patched.body[k] for k in unchanged} == {k: rule[k] for k in unchanged}
    assert patched.body["updated_at"] > rule["updated_at"]

    widened = await api.patch(
        f"/alerts/rules/{rule['id']}", json={"server_id": None, "enabled": False}, auth=owner
    )
    assert widened.body["server_id"] is None
    assert widened.body["enabled"] is False

    await api.delete(f"/alerts/rules/{rule['id']}", auth=owner, expect=204)
    await api.get(f"/alerts/rules/{rule['id']}", auth=owner, expect=404)
    await api.delete(f"/alerts/rules/{rule['id']}", auth=owner, expect=404)
    assert (await api.get("/alerts/rules", auth=owner, expect=200)).body == []


INVALID: list[tuple[dict[str, Any], str]] = [
    ({"metric": "latency"}, "metric"),
    ({"operator": "!="}, "operator"),
    ({"threshold": "5"}, "threshold"),
    ({"threshold": True}, "threshold"),
    ({"window_minutes": 0}, "window_minutes"),
    ({"window_minutes": 1441}, "window_minutes"),
    ({"window_minutes": 1.5}, "window_minutes"),
    ({"webhook_url": "ftp://example.com/hook"}, "webhook_url"),
    ({"slack_webhook_url": "hooks.slack.com/x"}, "slack_webhook_url"),
    ({"webhook_url": "http://"}, "webhook_url"),
    ({"name": ""}, "name"),
    ({"server_id": "not-a-uuid"}, "server_id"),
    ({"enabled": "yes"}, "enabled"),
]


async def test_rule_validation(api: Api) -> None:
    owner = await api.signup()
    valid = {"name": "r", "metric": "call_count", "operator": ">", "threshold": 1}
    valid["window_minutes"] = 5
    rule = await add_rule(api, owner, metric="call_count")
    for change, field in INVALID:
        reply = await api.post("/alerts/rules", json={**valid, **change}, auth=owner)
        assert reply.status == 422, (change, reply.body)
        assert f"body.{field}" in reply.detail, (change, reply.detail)
        if field != "server_id":
            reply = await api.patch(f"/alerts/rules/{rule['id']}", json=change, auth=owner)
            assert reply.status == 422, (change, reply.body)
            assert f"body.{field}" in reply.detail, (change, reply.detail)


async def test_rule_validation_edges(api: Api) -> None:
    owner = await api.signup()
    base = {"name": "r", "metric": "server_down", "operator": "==", "threshold": 1}
    for minutes in (1, 1440):
        await api.post(
            "/alerts/rules", json={**base, "window_minutes": minutes}, auth=owner, expect=201
        )
    missing = await api.post("/alerts/rules", json=base, auth=owner, expect=422)
    assert "body.window_minutes" in missing.detail
    await api.post("/alerts/rules", data="{not json", auth=owner, expect=400)
    await api.post("/alerts/rules", json=[base], auth=owner, expect=400)

    rule = await add_rule(api, owner, metric="call_count")
    for field in ("name", "metric", "operator", "threshold", "window_minutes", "enabled"):
        reply = await api.patch(
            f"/alerts/rules/{rule['id']}", json={field: None}, auth=owner, expect=422
        )
        assert f"body.{field}" in reply.detail
    reply = await api.patch(
        f"/alerts/rules/{rule['id']}", json={"window_minutes": 2000}, auth=owner, expect=422
    )
    await api.patch("/alerts/rules/not-a-uuid", json={"threshold": 1}, auth=owner, expect=404)
    await api.patch(f"/alerts/rules/{uuid.uuid4()}", json={"threshold": 1}, auth=owner, expect=404)


async def test_a_workspace_holds_at_most_its_bound_of_rules(
    make_api: Callable[..., Awaitable[Api]],
) -> None:
    api = await make_api(max_alert_rules_per_workspace=3)
    owner = await api.signup()
    other = await api.signup()
    body = {"name": "r", "metric": "call_count", "operator": ">", "threshold": 1}
    body["window_minutes"] = 5
    # Created at once, they still count each other.
    replies = await asyncio.gather(
        *(api.post("/alerts/rules", json=body, auth=owner) for _ in range(8))
    )
    assert sorted(reply.status for reply in replies) == [201] * 3 + [422] * 5
    refused = next(reply for reply in replies if reply.status == 422)
    assert refused.detail == (
        "this workspace has 3 alert rules, the most this gateway allows "
        "(GATEWAY_MAX_ALERT_RULES_PER_WORKSPACE): delete one first"
    )
    listed = await api.get("/alerts/rules", auth=owner, expect=200)
    assert len(listed.body) == 3
    # Another workspace has its own bound; a deleted rule makes room.
    await api.post("/alerts/rules", json=body, auth=other, expect=201)
    await api.delete(f"/alerts/rules/{listed.body[0]['id']}", auth=owner, expect=204)
    await api.post("/alerts/rules", json=body, auth=owner, expect=201)


async def test_server_must_belong_to_the_workspace(api: Api) -> None:
    owner = await api.signup()
    stranger = await api.signup()
    theirs = await add_server(api, stranger, "theirs")
    body = {"name": "r", "metric": "call_count", "operator": ">", "threshold": 1}
    body["window_minutes"] = 5
    for server_id in (theirs, str(uuid.uuid4())):
        reply = await api.post(
            "/alerts/rules", json={**body, "server_id": server_id}, auth=owner, expect=404
        )
        assert reply.detail == "server not found"
    rule = await add_rule(api, owner, metric="call_count")
    await api.patch(
        f"/alerts/rules/{rule['id']}", json={"server_id": theirs}, auth=owner, expect=404
    )


async def test_roles_and_tenancy(api: Api) -> None:
    owner = await api.org(await api.signup())
    admin = await api.member(owner, "admin")
    member = await api.member(owner, "member")
    key = await api.api_key(owner)
    outsider = await api.signup()

    rule = await add_rule(api, admin, metric="call_count", name="by admin")
    path = f"/alerts/rules/{rule['id']}"
    for reader in (member, key):
        assert (await api.get("/alerts/rules", auth=reader, expect=200)).body[0]["id"] == rule["id"]
        await api.get(path, auth=reader, expect=200)
        await api.get("/alerts/events", auth=reader, expect=200)
        await api.post("/alerts/rules", json={"name": "x"}, auth=reader, expect=403)
        await api.patch(path, json={"threshold": 2}, auth=reader, expect=403)
        await api.delete(path, auth=reader, expect=403)
    await api.get("/alerts/rules", expect=401)

    # Another workspace sees nothing and cannot touch it.
    assert (await api.get("/alerts/rules", auth=outsider, expect=200)).body == []
    await api.get(path, auth=outsider, expect=404)
    await api.patch(path, json={"threshold": 2}, auth=outsider, expect=404)
    await api.delete(path, auth=outsider, expect=404)
    await api.get(path, auth=owner, expect=200)


async def _incidents(api: Api) -> tuple[Any, dict[str, str], dict[str, str]]:
    """Two servers, two rules; a FIRING and a RESOLVED on one (rule, server), FIRING elsewhere."""
    owner = await api.signup()
    a = await add_server(api, owner, "a")
    b = await add_server(api, owner, "b")
    busy = await add_rule(api, owner, name="busy", metric="call_count", operator=">=", threshold=1)
    errors = await add_rule(
        api, owner, name="errors", metric="error_rate", operator=">", threshold=0.5, server_id=a
    )
    await ingest(api, owner, a, [{"status": "error"}])
    await evaluate(api)  # busy fires on a; errors fires on a
    await ingest(api, owner, b, [{}])
    await ingest(api, owner, a, [{}, {}, {}])
    await evaluate(api)  # busy fires on b; errors resolves on a (0.25)
    return owner, {"a": a, "b": b}, {"busy": busy["id"], "errors": errors["id"]}


async def test_events_filters_and_pages(api: Api) -> None:
    owner, servers, rules = await _incidents(api)
    reply = await api.get("/alerts/events", auth=owner, expect=200)
    assert reply.body["total"] == 4
    items = reply.body["items"]
    # Newest first: the second round's events come before the first round's.
    assert [(e["rule_name"], e["server_name"], e["event_type"]) for e in items[2:]] in (
        [("busy", "a", "FIRING"), ("errors", "a", "FIRING")],
        [("errors", "a", "FIRING"), ("busy", "a", "FIRING")],
    )
    assert {(e["rule_name"], e["server_name"], e["event_type"]) for e in items[:2]} == {
        ("busy", "b", "FIRING"),
        ("errors", "a", "RESOLVED"),
    }
    resolved = next(e for e in items if e["event_type"] == "RESOLVED")
    fired = next(e for e in items if e["rule_name"] == "errors" and e["event_type"] == "FIRING")
    assert resolved["metric_value"] == 0.25
    assert resolved["fired_at"] == fired["fired_at"]
    assert resolved["resolved_at"] == fired["resolved_at"] is not None
    assert fired["metric_value"] == 1.0

    by_rule = await events(api, owner, rule_id=rules["errors"])
    assert {e["event_type"] for e in by_rule} == {"FIRING", "RESOLVED"}
    by_server = await events(api, owner, server_id=servers["b"])
    assert [(e["rule_name"], e["event_type"]) for e in by_server] == [("busy", "FIRING")]
    firing = await api.get(
        "/alerts/events", auth=owner, params={"event_type": "FIRING", "limit": 2}, expect=200
    )
    assert firing.body["total"] == 3
    assert len(firing.body["items"]) == 2
    rest = await events(api, owner, event_type="FIRING", limit=2, offset=2)
    assert len(rest) == 1
    assert rest[0]["id"] not in {e["id"] for e in firing.body["items"]}
    combined = await events(api, owner, rule_id=rules["busy"], server_id=servers["a"])
    assert len(combined) == 1
    one = await api.get(f"/alerts/events/{fired['id']}", auth=owner, expect=200)
    assert one.body == fired

    for bad in ({"limit": 201}, {"limit": 0}, {"offset": -1}, {"event_type": "OK"}):
        await api.get("/alerts/events", auth=owner, params=bad, expect=422)
    await api.get("/alerts/events", auth=owner, params={"rule_id": "x"}, expect=422)
    assert (await api.get("/alerts/events", auth=owner, params={"limit": 200})).status == 200


async def test_events_are_tenant_scoped(api: Api) -> None:
    owner, _, rules = await _incidents(api)
    outsider = await api.signup()
    assert (await api.get("/alerts/events", auth=outsider, expect=200)).body == {
        "items": [],
        "total": 0,
    }
    assert await events(api, outsider, rule_id=rules["busy"]) == []
    event_id = (await events(api, owner))[0]["id"]
    await api.get(f"/alerts/events/{event_id}", auth=outsider, expect=404)
    await api.get(f"/alerts/events/{event_id}/deliveries", auth=outsider, expect=404)
    await api.get(f"/alerts/events/{event_id}/deliveries", auth=owner, expect=200)
    await api.get("/alerts/events/nope/deliveries", auth=owner, expect=404)


async def test_deleting_server_or_rule_deletes_its_events(api: Api, db: asyncpg.Connection) -> None:
    owner, servers, rules = await _incidents(api)
    await api.delete(f"/servers/{servers['b']}", auth=owner, expect=204)
    assert {e["server_name"] for e in await events(api, owner)} == {"a"}
    await api.delete(f"/alerts/rules/{rules['errors']}", auth=owner, expect=204)
    assert [e["rule_name"] for e in await events(api, owner)] == ["busy"]
    # A rule on one server goes with its server.
    await api.delete(f"/servers/{servers['a']}", auth=owner, expect=204)
    assert await db.fetchval("SELECT count(*) FROM alert_events") == 0
    assert await db.fetchval("SELECT count(*) FROM alert_rules") == 1  # busy: all servers


async def test_window_excludes_old_calls(api: Api) -> None:
    owner = await api.signup()
    server = await add_server(api, owner, "s")
    await ingest(api, owner, server, [{"created_at": ago(minutes=10)}])
    await add_rule(api, owner, metric="call_count", operator=">", threshold=0, window_minutes=5)
    await evaluate(api)
    assert await events(api, owner) == []
