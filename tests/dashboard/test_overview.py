"""The overview answers "is anything wrong?" at once."""

from __future__ import annotations

import uuid

import asyncpg

from gateway.dashboard.overview import ERROR_RATE_ATTENTION
from tests.helpers.api import Api
from tests.helpers.browser import BrowserFactory
from tests.helpers.proxying import add_server
from tests.helpers.upstreams import unused_url


async def test_all_clear_then_a_server_down_and_an_alert_firing(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory, sdk_stateless: str
) -> None:
    owner = await api.org(await api.signup(), "Watch")
    key = await api.api_key(owner)
    healthy = await add_server(api, db, owner, sdk_stateless)
    await api.post(f"/servers/{healthy}/probe", auth=owner, expect=200)
    calls = [{"server_id": healthy, "tool_name": "t", "status": "success"}] * 20
    await api.post("/tool-calls", json=[*calls, {**calls[0], "status": "error"}], auth=key)
    browser = await browser_for(await api.member(owner))
    page = await browser.get("/")
    assert page.has("All clear") and not page.has("Needs attention")
    assert page.has("4.8 %") and page.has("1 failed call")  # 1 of 21 in the last 24 h
    assert page.has("100.00 %")  # uptime
    assert 'class="sparkline"' in page.text
    assert not page.has("Register a server")  # a member's overview

    down = await add_server(api, db, owner, unused_url())
    await api.post(f"/servers/{down}/probe", auth=owner, expect=200)
    rule = await db.fetchval(
        "INSERT INTO alert_rules (workspace_id, name, metric, operator, threshold, "
        "window_minutes) VALUES ($1, '<i>errors</i>', 'error_rate', '>', 0.1, 5) RETURNING id",
        uuid.UUID(owner.workspace_id),
    )
    await db.execute(
        "INSERT INTO alert_events (workspace_id, rule_id, server_id, event_type, metric_value, "
        "fired_at) VALUES ($1, $2, $3, 'FIRING', 0.25, now())",
        uuid.UUID(owner.workspace_id),
        rule,
        uuid.UUID(healthy),
    )
    page = await browser.get("/")
    assert page.has("Needs attention") and page.has("1 server down") and page.has("1 alert firing")
    assert not page.has("All clear")
    assert page.has("<i>errors</i>") and "<i>errors</i>" not in page.text
    # Troubled servers first.
    down_name = await db.fetchval("SELECT name FROM servers WHERE id = $1", uuid.UUID(down))
    healthy_name = await db.fetchval("SELECT name FROM servers WHERE id = $1", uuid.UUID(healthy))
    table = page.text.split("<h2>Servers</h2>", 1)[1]
    assert table.index(down_name) < table.index(healthy_name)


async def test_an_error_rate_of_five_percent_or_more_needs_attention(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory, sdk_stateless: str
) -> None:
    """Every server healthy and no alert firing is not "All clear" while calls fail: the
    verdict weighs the last 24 hours' error rate (ERROR_RATE_ATTENTION, 5 %) as well."""
    assert ERROR_RATE_ATTENTION == 0.05
    owner = await api.org(await api.signup(), "Failing")
    key = await api.api_key(owner)
    server = await add_server(api, db, owner, sdk_stateless)
    await api.post(f"/servers/{server}/probe", auth=owner, expect=200)
    call = {"server_id": server, "tool_name": "t", "status": "success"}
    await api.post("/tool-calls", json=[call] * 19, auth=key, expect=201)
    browser = await browser_for(owner)
    page = await browser.get("/")
    assert page.has("All clear") and page.has("0.0 % of calls failed")
    await api.post("/tool-calls", json=[{**call, "status": "error"}], auth=key, expect=201)
    page = await browser.get("/")  # 1 of 20: exactly the threshold
    assert page.has("Needs attention:") and not page.has("All clear")
    assert page.has("5.0 % of calls failed (1 of 20)")
    assert 'class="stat-value warn"' in page.text  # the figure agrees with the banner


async def test_servers_not_probed_yet_are_waited_for_not_all_clear(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(), "New")
    browser = await browser_for(owner)
    page = await browser.get("/")
    assert not page.has("All clear") and not page.has("Waiting")  # nothing to judge yet
    for _ in range(2):
        await add_server(api, db, owner, "http://127.0.0.1:9/mcp")
    page = await browser.get("/")
    assert page.has("Waiting:") and page.has("2 servers not probed yet")
    assert not page.has("All clear") and not page.has("Needs attention")


async def test_a_removed_member_lands_in_their_own_workspace(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup(), "Shared")
    member = await api.member(owner)
    browser = await browser_for(member)
    assert (await browser.get("/")).has("Shared · the last 24 hours")
    await api.delete(
        f"/workspaces/{owner.workspace_id}/members/{member.user_id}", auth=owner, expect=204
    )
    page = await browser.get("/")
    assert page.has("Test User's workspace · the last 24 hours") and not page.has("Shared")
