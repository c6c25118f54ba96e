"""The Alerts pages: rules (admins change them through forms), events with filters and pages,
an event's notifications; roles, tenancy, CSRF and escaping."""

from __future__ import annotations

import re
import uuid
from typing import Any

import asyncpg

from tests.helpers.alerting import add_rule, add_server, deliver, evaluate, events, ingest, receiver
from tests.helpers.api import Account, Api
from tests.helpers.browser import BrowserFactory, Page

HOSTILE = "<script>alert(1)</script>"
DASH = "\u2013"  # the en dash of the pager's range

RULE_FORM = {
    "name": "Errors on billing",
    "server_id": "",
    "metric": "error_rate",
    "operator": ">=",
    "threshold": "0.25",
    "window_minutes": "15",
    "webhook_url": "https://hooks.example.com/T000/secret-path",
    "slack_webhook_url": "",
    "enabled": "true",
}


def _error_of(page: Page, field: str) -> str:
    """The message shown next to a form field (its `e-<field>` paragraph)."""
    found = re.search(rf'<p class="error" id="f-{field}-error">([^<]*)</p>', page.text)
    assert found is not None, f"no error next to {field}"
    return found.group(1)


async def _rules(api: Api, account: Account) -> list[dict[str, Any]]:
    reply = await api.get("/alerts/rules", auth=account, expect=200)
    rules: list[dict[str, Any]] = reply.body
    return rules


async def _firing(api: Api, owner: Account, name: str = "Errors") -> tuple[str, dict[str, Any]]:
    """A server whose only call failed, a rule on its error rate, and so a FIRING event."""
    server_id = await add_server(api, owner, "billing")
    await ingest(api, owner, server_id, [{"status": "error"}])
    rule = await add_rule(
        api, owner, name=name, metric="error_rate", operator=">", threshold=0.5, server_id=server_id
    )
    await evaluate(api)
    return server_id, rule


async def test_each_page_renders_for_a_member(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.org(await api.signup())
    member = await api.member(owner, "member")
    server_id, rule = await _firing(api, owner)
    await add_rule(
        api,
        owner,
        name="Busy everywhere",
        metric="call_count",
        threshold=1000,
        window_minutes=60,
        slack_webhook_url="https://hooks.slack.com/services/T0/B0/SECRET",
        webhook_url="http://receiver.example:8080/alerts?token=abc",
        enabled=False,
    )
    [event] = await events(api, owner)
    browser = await browser_for(member)

    page = await browser.get("/alerts")
    assert '<a href="/alerts" aria-current="page">Alerts</a>' in page.text
    # The rules: where, when, whom they notify (the host only: a Slack URL's path is its secret).
    assert page.has("Errors") and page.has("error_rate > 0.5 over 5 min")
    assert f'<a href="/servers/{server_id}">billing</a>' in page.text
    assert page.has("Busy everywhere") and page.has("All servers")
    assert page.has("call_count > 1000 over 60 min") and page.has("disabled")
    assert page.has("(hooks.slack.com)") and page.has("(receiver.example)")
    assert "SECRET" not in page.text and "token=abc" not in page.text
    # The events, each linking to its page.
    assert page.has("FIRING") and page.has("still firing")
    assert f'href="/alerts/events/{event["id"]}"' in page.text
    for label in ("Rule", "Server", "Event type"):
        assert f">{label}</label>" in page.text

    page = await browser.get(f"/alerts/events/{event['id']}")
    assert page.has("Errors on billing") and page.has("error_rate > 0.5 over 5 min")
    assert page.has("Metric value") and page.has("still firing")
    assert page.has("No notifications")
    assert f"/alerts?rule_id={rule['id']}" in page.text


async def test_an_admin_creates_edits_and_deletes_a_rule(
    api: Api, browser_for: BrowserFactory, db: asyncpg.Connection
) -> None:
    owner = await api.org(await api.signup())
    admin = await api.member(owner, "admin")
    server_id = await add_server(api, owner, "billing")
    browser = await browser_for(admin)

    page = await browser.get("/alerts")
    assert page.has("New rule") and page.has("No alert rules yet")
    page = await browser.get("/alerts/rules/new")
    for label in ("Name", "Server", "Metric", "Operator", "Threshold", "Window (minutes)"):
        assert f'">{label} <span' in page.text or f'">{label}</label>' in page.text, label
    assert f'<option value="{server_id}">billing</option>' in page.text
    page = await browser.post("/alerts/rules/new", {**RULE_FORM, "server_id": server_id})
    assert page.status == 200 and page.url.endswith("/alerts")
    assert page.has("Errors on billing") and page.has("error_rate >= 0.25 over 15 min")
    assert page.has("(hooks.example.com)") and "secret-path" not in page.text
    [rule] = await _rules(api, owner)
    assert {k: rule[k] for k in ("name", "server_id", "metric", "operator", "enabled")} == {
        "name": "Errors on billing",
        "server_id": server_id,
        "metric": "error_rate",
        "operator": ">=",
        "enabled": True,
    }
    assert (rule["threshold"], rule["window_minutes"]) == (0.25, 15)
    assert rule["webhook_url"] == RULE_FORM["webhook_url"]
    assert rule["slack_webhook_url"] is None

    # The edit form shows the rule as stored; what is sent replaces it, an emptied URL clears.
    page = await browser.get(f"/alerts/rules/{rule['id']}/edit")
    assert page.has("Edit rule Errors on billing")
    assert 'name="threshold" type="text" value="0.25"' in page.text
    assert f'<option value="{server_id}" selected>billing</option>' in page.text
    assert 'value="true" checked' in page.text
    changes = {
        "name": "Slow anywhere",
        "server_id": "",
        "metric": "p95_latency_ms",
        "operator": ">",
        "threshold": "800",
        "window_minutes": "30",
        "webhook_url": "",
        "slack_webhook_url": "https://hooks.slack.com/services/x",
    }  # no "enabled": the box unticked
    page = await browser.post(f"/alerts/rules/{rule['id']}/edit", changes)
    assert page.url.endswith("/alerts") and page.has("p95_latency_ms > 800 over 30 min")
    [edited] = await _rules(api, owner)
    assert {k: edited[k] for k in changes} == {
        **changes,
        "server_id": None,
        "threshold": 800,
        "window_minutes": 30,
        "webhook_url": None,
    }
    assert edited["enabled"] is False

    page = await browser.post(f"/alerts/rules/{rule['id']}/delete")
    assert page.url.endswith("/alerts") and page.has("No alert rules yet")
    assert await db.fetchval("SELECT count(*) FROM alert_rules") == 0


async def test_bad_input_is_shown_next_to_its_field_and_changes_nothing(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.signup()
    rule = await add_rule(api, owner, name="Kept", metric="call_count", threshold=5)
    browser = await browser_for(owner)
    refused = [
        ({"threshold": "lots"}, "threshold", "valid number"),
        ({"window_minutes": "0"}, "window_minutes", "greater than or equal to 1"),
        ({"webhook_url": "ftp://hooks.example.com/x"}, "webhook_url", "http:// or https://"),
        ({"slack_webhook_url": "hooks.slack.com/x"}, "slack_webhook_url", "http:// or https://"),
        ({"name": "  "}, "name", "at least 1 character"),
    ]
    for change, field, message in refused:
        for path in ("/alerts/rules/new", f"/alerts/rules/{rule['id']}/edit"):
            await browser.get(path)
            page = await browser.post(path, {**RULE_FORM, **change})
            assert page.status == 422, (path, change)
            assert message in _error_of(page, field), (path, change)
            # What was typed is shown again, to be corrected.
            typed = re.escape(next(iter(change.values())))
            assert re.search(rf'name="{field}" type="\w+" value="{typed}"', page.text)
    assert await _rules(api, owner) == [rule]


async def test_a_member_sees_no_buttons_and_may_change_nothing(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.org(await api.signup())
    member = await api.member(owner, "member")
    rule = await add_rule(api, owner, name="Theirs", metric="call_count")
    browser = await browser_for(member)

    page = await browser.get("/alerts")
    assert page.has("Theirs")
    for button in ("New rule", "Edit rule", "Delete rule", "/alerts/rules/new"):
        assert not page.has(button), button
    for path in ("/alerts/rules/new", f"/alerts/rules/{rule['id']}/edit"):
        refused = await browser.get(path, expect=403)
        assert refused.has("requires the admin role")
    for path in (
        "/alerts/rules/new",
        f"/alerts/rules/{rule['id']}/edit",
        f"/alerts/rules/{rule['id']}/delete",
    ):
        refused = await browser.post(path, RULE_FORM)
        assert refused.status == 403, path
        assert refused.has("requires the admin role")
    assert await _rules(api, owner) == [rule]


async def test_every_form_needs_its_csrf_token(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.signup()
    rule = await add_rule(api, owner, name="Kept", metric="call_count")
    browser = await browser_for(owner)
    other = await browser_for(await api.signup())
    assert other.last is not None
    await browser.get("/alerts")
    for path in (
        "/alerts/rules/new",
        f"/alerts/rules/{rule['id']}/edit",
        f"/alerts/rules/{rule['id']}/delete",
    ):
        for token in ("", "0" * 64, other.last.csrf):
            page = await browser.post(path, RULE_FORM, csrf=token)
            assert page.status == 403, (path, token)
            assert page.has("did not come from this site")
    assert await _rules(api, owner) == [rule]


async def test_another_workspaces_rules_and_events_are_not_found(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner = await api.signup()
    _, rule = await _firing(api, owner)
    [event] = await events(api, owner)
    # An owner of their own workspace: refused for the workspace, not for the role.
    outsider = await browser_for(await api.signup())
    page = await outsider.get("/alerts")
    assert not page.has("Errors") and page.has("No events yet")
    await outsider.get(f"/alerts/rules/{rule['id']}/edit", expect=404)
    await outsider.get(f"/alerts/events/{event['id']}", expect=404)
    await outsider.post(f"/alerts/rules/{rule['id']}/edit", RULE_FORM, expect=404)
    await outsider.post(f"/alerts/rules/{rule['id']}/delete", expect=404)
    # A malformed or unknown id is simply not found either.
    for bad in ("nope", str(uuid.uuid4())):
        assert (await outsider.get(f"/alerts/events/{bad}", expect=404)).has("not found")
        await outsider.get(f"/alerts/rules/{bad}/edit", expect=404)
        await outsider.post(f"/alerts/rules/{bad}/edit", RULE_FORM, expect=404)
        await outsider.post(f"/alerts/rules/{bad}/delete", expect=404)
    assert [r["id"] for r in await _rules(api, owner)] == [rule["id"]]


async def test_hostile_names_are_shown_escaped(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.signup()
    server_id = await add_server(api, owner, "<b>srv</b>")
    await ingest(api, owner, server_id, [{"status": "error"}])
    rule = await add_rule(api, owner, name=HOSTILE, metric="error_rate", threshold=0.5)
    await evaluate(api)
    [event] = await events(api, owner)
    browser = await browser_for(owner)
    for path in (
        "/alerts",
        f"/alerts/rules/{rule['id']}/edit",
        f"/alerts/events/{event['id']}",
    ):
        page = await browser.get(path)
        assert page.has(HOSTILE), path
        assert HOSTILE not in page.text and "<b>srv</b>" not in page.text, path
    page = await browser.get("/alerts")
    assert page.has(f"Delete rule {HOSTILE}") and page.has(f"Delete rule “{HOSTILE}”")


async def test_an_event_page_lists_its_notifications_and_their_attempts(
    api: Api, browser_for: BrowserFactory
) -> None:
    async with receiver() as recv:
        recv.script["/hook"] = [503]
        owner = await api.signup()
        server_id = await add_server(api, owner, "billing")
        await ingest(api, owner, server_id, [{"status": "error"}])
        await add_rule(
            api,
            owner,
            name="Errors",
            metric="error_rate",
            threshold=0.5,
            webhook_url=recv.url("/hook"),
            slack_webhook_url=recv.url("/slack"),
        )
        await evaluate(api)
        assert await deliver(api) == 2  # the webhook answers 503 (retried later), Slack 200
    [event] = await events(api, owner)
    browser = await browser_for(owner)
    page = await browser.get(f"/alerts/events/{event['id']}")
    assert page.has("Webhook") and page.has("Slack")
    assert page.has('<span class="badge delivery-pending">pending</span>')
    assert page.has('<span class="badge delivery-delivered">delivered</span>')
    assert page.has("HTTP 503: receiver says no") and page.has("HTTP 200")
    assert page.has("Next attempt") and page.has("Delivered")
    assert page.text.count('<td data-label="#" class="num">1</td>') == 2  # one attempt each


async def test_events_filter_and_come_in_pages_of_fifty(
    api: Api, browser_for: BrowserFactory, db: asyncpg.Connection
) -> None:
    owner = await api.signup()
    server_id, rule = await _firing(api, owner)
    other = await add_rule(api, owner, name="Quiet", metric="call_count", threshold=100)
    # 54 resolved incidents of the one rule besides the open one: 109 events in all.
    await db.execute(
        """
        INSERT INTO alert_events (workspace_id, rule_id, server_id, event_type, metric_value,
                                  fired_at, resolved_at, created_at)
        SELECT $1, $2, $3, kind, 0.75, now() - make_interval(hours => n + 1),
               now() - make_interval(hours => n), now() - make_interval(hours => n)
        FROM generate_series(1, 54) AS n, unnest(ARRAY['FIRING', 'RESOLVED']) AS kind
        """,
        uuid.UUID(owner.workspace_id),
        uuid.UUID(rule["id"]),
        uuid.UUID(server_id),
    )
    browser = await browser_for(owner)

    page = await browser.get("/alerts")
    assert page.text.count('href="/alerts/events/') == 50
    assert page.has(f"1{DASH}50 of 109") and page.has("Older →") and not page.has("← Newer")
    page = await browser.get("/alerts?offset=100")
    assert page.text.count('href="/alerts/events/') == 9
    assert page.has(f"101{DASH}109 of 109") and page.has("← Newer") and not page.has("Older →")
    # Past the end (events deleted meanwhile): to the last page.
    page = await browser.get("/alerts?offset=99999999999999999999")  # past any bigint
    assert page.has("101\u2013109 of 109")
    page = await browser.get("/alerts?offset=400")
    assert page.has(f"101{DASH}109 of 109")

    page = await browser.get("/alerts?event_type=FIRING")
    assert page.has(f"1{DASH}50 of 55") and page.has(
        'href="/alerts?event_type=FIRING&offset=50#events"'
    )
    assert '<option value="FIRING" selected>' in page.text
    assert page.has("still firing")  # the open incident is the newest
    page = await browser.get("/alerts?event_type=FIRING&offset=50")
    assert page.has(f"51{DASH}55 of 55") and not page.has("still firing")
    page = await browser.get(f"/alerts?rule_id={other['id']}&server_id={server_id}")
    assert page.has("No events match these filters") and page.has("Clear filters")
    assert f'<option value="{other["id"]}" selected>Quiet</option>' in page.text
    page = await browser.get(f"/alerts?event_type=RESOLVED&server_id={server_id}&offset=50")
    assert page.has(f"51{DASH}54 of 54") and not page.has("still firing")
    # Filters that make no sense are dropped, not refused.
    page = await browser.get("/alerts?rule_id=nope&event_type=OK&offset=x")
    assert page.has(f"1{DASH}50 of 109") and not page.has("Clear filters")
