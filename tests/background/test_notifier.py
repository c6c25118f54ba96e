"""Alert notifications: payloads, the outbox, retries with backoff, restarts, and the sending
slots shared in turns between workspaces and their destinations."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg

from gateway.background.notifier import DeliveryPolicy, deliver_due
from gateway.keys import HTTP, POOL
from gateway.ops.metrics import METRICS
from tests.helpers.alerting import (
    FAST,
    Receiver,
    add_rule,
    add_server,
    deliver,
    evaluate,
    events,
    ingest,
    receiver,
)
from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.black_hole import BlackHole, black_hole
from tests.helpers.upstreams import unused_url


async def _errors_rule(
    api: Api, recv: Receiver, *, slack: bool = True, name: str = "Errors"
) -> tuple[Account, str, dict[str, Any]]:
    owner = await api.signup()
    server = await add_server(api, owner, "billing")
    await ingest(api, owner, server, [{"status": "error"}])
    rule = await add_rule(
        api,
        owner,
        name=name,
        metric="error_rate",
        operator=">",
        threshold=0.5,
        webhook_url=recv.url("/hook"),
        slack_webhook_url=recv.url("/slack") if slack else None,
    )
    return owner, server, rule


async def _deliveries(api: Api, auth: Account, event_id: str) -> list[dict[str, Any]]:
    reply = await api.get(f"/alerts/events/{event_id}/deliveries", auth=auth, expect=200)
    items: list[dict[str, Any]] = reply.body
    return items


async def test_firing_then_resolved_notifications(make_api: AppFactory) -> None:
    """The whole path with the background loops on: evaluator -> outbox -> notifier -> receiver."""
    api = await make_api(run_workers=True, alert_eval_interval_seconds=0.2)
    async with receiver() as recv:
        owner, server, rule = await _errors_rule(api, recv)
        hooks = await recv.wait_for("/hook", 1)
        slacks = await recv.wait_for("/slack", 1)
        await ingest(api, owner, server, [{"status": "success"}] * 3)
        hooks = await recv.wait_for("/hook", 2)
        slacks = await recv.wait_for("/slack", 2)

    resolved, fired = await events(api, owner)
    workspace = (await api.get("/auth/me", auth=owner, expect=200)).body["current_workspace"]
    rule_now = (await api.get(f"/alerts/rules/{rule['id']}", auth=owner, expect=200)).body

    firing_body, resolved_body = hooks[0].body, hooks[1].body
    assert set(firing_body) == {"event", "rule", "workspace"}
    assert firing_body["rule"] == rule_now
    assert firing_body["workspace"] == {"id": workspace["id"], "name": workspace["name"]}
    # The event as the API shows it; resolved_at was null when it was sent.
    assert firing_body["event"] == {**fired, "resolved_at": None}
    assert resolved_body["event"] == resolved
    assert resolved_body["event"]["event_type"] == "RESOLVED"
    assert hooks[0].headers["Content-Type"] == "application/json"

    firing_text, resolved_text = slacks[0].body["text"], slacks[1].body["text"]
    assert set(slacks[0].body) == {"text"}
    assert firing_text.startswith("[FIRING] Errors")
    assert resolved_text.startswith("[RESOLVED] Errors")
    assert '"billing"' in firing_text
    assert "error_rate is 1 " in firing_text
    assert "error_rate is 0.25 " in resolved_text
    assert "threshold &gt; 0.5" in firing_text  # Slack escapes < > &
    assert "\n" not in firing_text

    for event in (fired, resolved):
        items = await _deliveries(api, owner, event["id"])
        assert sorted(d["target"] for d in items) == ["slack", "webhook"]
        for delivery in items:
            assert delivery["status"] == "delivered"
            assert delivery["next_attempt_at"] is None
            assert delivery["finished_at"] is not None
            [attempt] = delivery["attempts"]
            assert attempt["status_code"] == 200
            assert attempt["error"] is None


async def test_retries_until_delivered(api: Api, db: asyncpg.Connection) -> None:
    async with receiver() as recv:
        recv.script["/hook"] = [500, 503]
        owner, _, _ = await _errors_rule(api, recv, slack=False)
        await evaluate(api)
        [fired] = await events(api, owner)
        [pending] = await _deliveries(api, owner, fired["id"])
        assert (pending["status"], pending["attempts"]) == ("pending", [])

        for _ in range(40):
            await deliver(api)
            if len(recv.on("/hook")) == 3:
                break
            await asyncio.sleep(0.02)
        hooks = recv.on("/hook")
    assert len(hooks) == 3
    assert hooks[0].body == hooks[2].body
    # The same delivery id each time, so a receiver can drop duplicates.
    assert len({h.headers["X-Alert-Delivery-Id"] for h in hooks}) == 1
    # Backoff doubles: 0.05 s, then 0.1 s.
    assert hooks[1].at - hooks[0].at >= 0.05
    assert hooks[2].at - hooks[1].at >= 0.1

    [delivery] = await _deliveries(api, owner, fired["id"])
    assert delivery["status"] == "delivered"
    attempts = delivery["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    assert [a["status_code"] for a in attempts] == [500, 503, 200]
    assert attempts[0]["error"] == "HTTP 500: receiver says no"
    assert attempts[2]["error"] is None
    assert await deliver(api) == 0  # nothing left to send


async def test_gives_up_after_max_attempts(api: Api) -> None:
    async with receiver() as recv:
        recv.script["/hook"] = [500] * 10
        owner, _, _ = await _errors_rule(api, recv, slack=False)
        await evaluate(api)
        for _ in range(40):
            await deliver(api)
            if len(recv.on("/hook")) == FAST.max_attempts:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # longer than the next backoff would be
        assert await deliver(api) == 0
        assert len(recv.on("/hook")) == FAST.max_attempts
    [fired] = await events(api, owner)
    [delivery] = await _deliveries(api, owner, fired["id"])
    assert delivery["status"] == "failed"
    assert delivery["next_attempt_at"] is None
    assert delivery["finished_at"] is not None
    assert [a["status_code"] for a in delivery["attempts"]] == [500, 500, 500]


async def test_timeouts_and_unreachable_receivers(api: Api) -> None:
    async with receiver() as recv:
        recv.delay = 1.0
        owner = await api.signup()
        server = await add_server(api, owner, "s")
        await ingest(api, owner, server, [{"status": "error"}])
        await add_rule(
            api,
            owner,
            metric="error_rate",
            threshold=0.5,
            webhook_url=recv.url("/hook"),
            slack_webhook_url=unused_url(),
        )
        await evaluate(api)
        policy = DeliveryPolicy(timeout_seconds=0.2, max_attempts=1)
        assert await deliver(api, policy) == 2
    [fired] = await events(api, owner)
    by_target = {d["target"]: d for d in await _deliveries(api, owner, fired["id"])}
    [timed_out] = by_target["webhook"]["attempts"]
    assert timed_out["status_code"] is None
    assert timed_out["error"] == "timed out after 0.2 s"
    assert 150 <= timed_out["duration_ms"] < 1000
    [refused] = by_target["slack"]["attempts"]
    assert refused["status_code"] is None
    assert refused["error"].startswith("ClientConnectorError")
    assert {d["status"] for d in by_target.values()} == {"failed"}


async def test_resolved_waits_for_its_firing(api: Api) -> None:
    """A receiver never sees an incident's RESOLVED before its FIRING, even when the FIRING
    notification needs a retry."""
    async with receiver() as recv:
        recv.script["/hook"] = [500]
        owner, server, _ = await _errors_rule(api, recv, slack=False)
        await evaluate(api)
        await ingest(api, owner, server, [{"status": "success"}] * 3)
        await evaluate(api)
        assert await deliver(api) == 1  # the FIRING fails; the RESOLVED is held back
        await asyncio.sleep(0.06)
        assert await deliver(api) == 2
        hooks = recv.on("/hook")
    assert [h.body["event"]["event_type"] for h in hooks] == ["FIRING", "FIRING", "RESOLVED"]


async def test_undelivered_notifications_survive_a_restart(make_api: AppFactory) -> None:
    async with receiver() as recv:
        before = await make_api()  # workers off: nothing is sent
        owner, _, _ = await _errors_rule(before, recv)
        await evaluate(before)
        await before.client.close()
        assert recv.received == []

        after = await make_api(run_workers=True, alert_eval_interval_seconds=60.0)
        await recv.wait_for("/hook", 1)
        await recv.wait_for("/slack", 1)
        await asyncio.sleep(0.2)
        assert len(recv.received) == 2  # each sent once
    [fired] = await events(after, owner)
    assert {d["status"] for d in await _deliveries(after, owner, fired["id"])} == {"delivered"}


# -- sending slots shared in turns -----------------------------------------------------------------


async def queue_directly(
    api: Api, db: asyncpg.Connection, owner: Account, urls: list[str], count: int
) -> None:
    """`count` webhook deliveries of owner's workspace, due since a minute ago, spread over
    `urls`, each its own incident stream (so none waits for another): what thousands of
    incidents of a tenant's rules leave in the outbox."""
    server = await add_server(api, owner, f"s-{uuid.uuid4().hex[:6]}")
    rule = await add_rule(api, owner, metric="error_rate", threshold=0.5, enabled=False)
    event_id = await db.fetchval(
        "INSERT INTO alert_events (workspace_id, rule_id, server_id, event_type, metric_value, "
        "fired_at) VALUES ($1, $2, $3, 'FIRING', 1, now()) RETURNING id",
        uuid.UUID(owner.workspace_id),
        uuid.UUID(rule["id"]),
        uuid.UUID(server),
    )
    await db.execute(
        "INSERT INTO alert_deliveries (event_id, workspace_id, rule_id, server_id, target, url, "
        "payload, next_attempt_at, created_at) "
        "SELECT $1, $2, $3, gen_random_uuid(), 'webhook', ($4::text[])[1 + i % cardinality($4)], "
        "'{}'::jsonb, now() - interval '1 minute', now() - interval '1 minute' "
        "FROM generate_series(0, $5 - 1) AS i",
        event_id,
        uuid.UUID(owner.workspace_id),
        uuid.UUID(rule["id"]),
        urls,
        count,
    )


async def test_one_tenants_hanging_webhooks_leave_anothers_alert_on_time(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    """Issue 20, finding 5: 5,000 deliveries to webhooks that never answer leave another
    tenant's FIRING and RESOLVED delivered within one evaluation interval plus a second, with
    the evaluator and the notifier running as they do in production."""
    interval = 1.0
    api = await make_api(run_workers=True, alert_eval_interval_seconds=interval)
    async with black_hole() as hole, black_hole() as other_hole, receiver() as recv:
        attacker = await api.signup()
        await queue_directly(api, db, attacker, [hole.url("/a"), other_hole.url("/b")], 5000)

        owner = await api.signup()
        server = await add_server(api, owner, "billing")
        await ingest(api, owner, server, [{"status": "error"}])
        started = time.monotonic()
        await add_rule(
            api, owner, metric="error_rate", operator=">", threshold=0.5,
            webhook_url=recv.url("/hook"),
        )  # fmt: skip
        [firing] = await recv.wait_for("/hook", 1, within=interval + 1.0)
        assert firing.at - started < interval + 1.0
        assert firing.body["event"]["event_type"] == "FIRING"

        await ingest(api, owner, server, [{"status": "success"}] * 3)
        started = time.monotonic()
        hooks = await recv.wait_for("/hook", 2, within=interval + 1.0)
        assert hooks[1].at - started < interval + 1.0
        assert hooks[1].body["event"]["event_type"] == "RESOLVED"

        # The attacker's sends, each held for the 10 s timeout, took its workspace's share (4),
        # half of it per destination host.
        assert (len(hole.arrivals), len(other_hole.arrivals)) == (2, 2)
    pending = "SELECT count(*) FROM alert_deliveries WHERE status = 'pending' AND workspace_id = $1"
    assert await db.fetchval(pending, uuid.UUID(attacker.workspace_id)) == 5000


async def test_sends_in_flight_are_bounded_per_workspace_and_per_destination(
    api: Api, db: asyncpg.Connection
) -> None:
    """Shares of 3 per workspace and 2 per destination host of a workspace: a busy workspace's
    two hosts together hold 3 slots, neither more than 2, and the quiet workspace's delivery
    goes out at once beside them."""
    hold = 0.3
    async with receiver() as first, receiver() as second, receiver() as quiet:
        for recv in (first, second, quiet):
            recv.delay = hold
        busy, other = await api.signup(), await api.signup()
        await queue_directly(api, db, busy, [first.url("/hook"), second.url("/hook")], 12)
        await queue_directly(api, db, other, [quiet.url("/hook")], 1)
        policy = DeliveryPolicy(timeout_seconds=2.0, concurrency=20, per_workspace=3, per_host=2)
        started = time.monotonic()
        assert await deliver(api, policy) == 13
    arrivals = {name: [r.at for r in recv.received] for name, recv in
                (("first", first), ("second", second), ("quiet", quiet))}  # fmt: skip
    overlap = hold - 0.05  # requests that arrived closer together than this were held together
    assert BlackHole(arrivals=arrivals["first"]).most_within(overlap) == 2
    assert BlackHole(arrivals=arrivals["second"]).most_within(overlap) == 2
    both = arrivals["first"] + arrivals["second"]
    assert BlackHole(arrivals=both).most_within(overlap) == 3
    assert arrivals["quiet"][0] - started < hold
    assert len(both) == 12 and len(set(r.headers["X-Alert-Delivery-Id"] for r in
                                       first.received + second.received)) == 12  # fmt: skip


async def test_a_hanging_send_does_not_hold_up_the_next_ones(
    api: Api, db: asyncpg.Connection
) -> None:
    """Sending is a pipeline: while one send hangs until its timeout, the freed slot takes
    the next deliveries, of the same workspace too (its other host)."""
    timeout = 2.0
    async with black_hole() as hole, receiver() as recv:
        owner = await api.signup()
        await queue_directly(api, db, owner, [hole.url("/dead")], 1)
        await queue_directly(api, db, owner, [recv.url("/ok")], 6)
        policy = DeliveryPolicy(
            timeout_seconds=timeout, max_attempts=1, concurrency=2, per_workspace=2, per_host=1
        )
        sending = asyncio.create_task(deliver(api, policy))
        await recv.wait_for("/ok", 6, within=timeout - 0.5)
        assert not sending.done()  # the hanging one is still in flight
        assert len(hole.arrivals) == 1
        assert await sending == 7


async def test_two_notifiers_send_each_delivery_once(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    first, second = await make_api(), await make_api()
    async with receiver() as recv:
        recv.delay = 0.02
        for _ in range(3):
            await queue_directly(first, db, await first.signup(), [recv.url("/hook")], 10)
        policy = DeliveryPolicy(timeout_seconds=2.0, concurrency=4, per_workspace=2, per_host=2)
        counts = await asyncio.gather(
            *(
                deliver_due(app.app[POOL], app.app[HTTP], policy, app.app[METRICS])
                for app in (first, second)
            )
        )
    assert sum(counts) == 30
    ids = [r.headers["X-Alert-Delivery-Id"] for r in recv.received]
    assert len(ids) == len(set(ids)) == 30
