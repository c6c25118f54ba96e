"""Alert notifications: payloads, the outbox, retries with backoff, and restarts."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from gateway.workers.notifier import DeliveryPolicy
from tests.alerting import (
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
from tests.api.conftest import cheap_password_hashing  # noqa: F401 -- autouse fixture
from tests.conftest import AppFactory
from tests.support import Account, Api
from tests.upstreams import unused_url


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
