"""The alert metric tool_changes: how many of a server's tools were added, removed or changed in
the window, firing and resolving like every metric, with its notifications."""

from __future__ import annotations

import uuid

import asyncpg

from tests.helpers.alerting import add_rule, deliver, evaluate, events, receiver
from tests.helpers.api import Api
from tests.helpers.integrity import edited, probe, register
from tests.helpers.upstreams import fake_upstream


async def test_tool_changes_fire_then_resolve_once_out_of_the_window(
    api: Api, db: asyncpg.Connection
) -> None:
    owner = await api.signup()
    async with fake_upstream() as fake, receiver() as recv:
        server_id = await register(api, owner, fake.url)
        quiet_id = await register(api, owner, fake.url, name="quiet")
        for server in (server_id, quiet_id):
            await probe(api, owner, server)
        await add_rule(
            api,
            owner,
            name="rug pull",
            metric="tool_changes",
            operator=">=",
            threshold=2,
            window_minutes=10,
            webhook_url=recv.url("/hook"),
        )
        fake.tools = edited(fake.tools, "alpha", description="now evil")
        await probe(api, owner, server_id)
        await evaluate(api)
        assert await events(api, owner) == []  # one change: under the threshold

        fake.tools = [*fake.tools[1:], {"name": "new", "inputSchema": {"type": "object"}}]
        await probe(api, owner, server_id)
        assert await evaluate(api) == 1
        [fired] = await events(api, owner)
        assert (fired["event_type"], fired["server_id"], fired["metric_value"]) == (
            "FIRING",
            server_id,
            3.0,  # alpha changed, then alpha removed and new added
        )
        assert await evaluate(api) == 0  # still holding: no second event

        # The changes leave the window (as if ten minutes had passed): 0, resolved.
        await db.execute(
            "UPDATE tool_changes SET detected_at = now() - interval '11 minutes' "
            "WHERE server_id = $1",
            uuid.UUID(server_id),
        )
        assert await evaluate(api) == 1
        resolved = (await events(api, owner))[0]
        assert (resolved["event_type"], resolved["metric_value"]) == ("RESOLVED", 0.0)
        assert resolved["fired_at"] == fired["fired_at"]

        await deliver(api)
        hooks = await recv.wait_for("/hook", 2)
        assert [h.body["event"]["event_type"] for h in hooks] == ["FIRING", "RESOLVED"]
        assert all(h.body["rule"]["metric"] == "tool_changes" for h in hooks)


async def test_the_metric_is_validated_like_the_others(api: Api) -> None:
    owner = await api.signup()
    reply = await api.post(
        "/alerts/rules",
        json={
            "name": "r",
            "metric": "tool_change",
            "operator": ">",
            "threshold": 0,
            "window_minutes": 5,
        },
        auth=owner,
        expect=422,
    )
    assert "tool_changes" in reply.body["detail"]
