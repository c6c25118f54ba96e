"""Alerts: rules (admins change them), the events they produced, each event's notifications."""

from __future__ import annotations

from typing import Any, get_args
from urllib.parse import urlsplit

from aiohttp import web

from gateway.api import alerts as alerts_api
from gateway.api import servers as servers_api
from gateway.api.alerts import EventsQuery, EventType, Metric, Operator, RuleIn, RulePatch
from gateway.api.servers import ServerQuery
from gateway.dashboard.pages import (
    PAGE_SIZE,
    FormInvalid,
    Pages,
    api_errors,
    authorize,
    call,
    field_text,
    page_url,
    pager,
    parse_uuid,
    path_id,
    redirect,
    render,
    validated,
)
from gateway.db import alerts as alerts_db
from gateway.db.types import BIGINT_MAX
from gateway.errors import ApiError, Forbidden

pages = Pages()


_METRIC_TEXT = {
    "error_rate": "error_rate: share of calls that failed, 0 to 1",
    "avg_latency_ms": "avg_latency_ms: mean call duration, ms",
    "p95_latency_ms": "p95_latency_ms: 95th percentile call duration, ms",
    "call_count": "call_count: number of calls",
    "server_down": "server_down: 1 when the newest probe found the server down, else 0",
    "tool_changes": "tool_changes: tools added, removed or changed",
}
_OPERATOR_TEXT = {
    ">": "> above",
    ">=": ">= at or above",
    "<": "< below",
    "<=": "<= at or below",
    "==": "== equal to",
}
# The options come from the API's own types, so a new metric shows up here by itself.
METRICS = [(m, _METRIC_TEXT.get(m, m)) for m in get_args(Metric)]
OPERATORS = [(o, _OPERATOR_TEXT.get(o, o)) for o in get_args(Operator)]
EVENT_TYPES: tuple[str, ...] = get_args(EventType)

# The rule's fields the form has a text input for (enabled is a checkbox).
_TEXT_FIELDS = tuple(name for name in alerts_db.RULE_FIELDS if name != "enabled")
# Left empty in the form, these are null: every server, no notification of that kind.
_EMPTY_IS_NULL = ("server_id", "slack_webhook_url", "webhook_url")
_NEW_RULE = {
    **dict.fromkeys(_TEXT_FIELDS, ""),
    "metric": "error_rate",
    "operator": ">",
    "window_minutes": "5",
    "enabled": True,
}


@pages.get("/alerts", "alerts.html")
async def alerts_page(request: web.Request) -> dict[str, Any] | web.StreamResponse:
    rule_id = parse_uuid(request.query.get("rule_id"))
    server_id = parse_uuid(request.query.get("server_id"))
    event_type = request.query.get("event_type")
    # A stale or hand-edited filter is dropped rather than refusing the whole page.
    filters = {
        "rule_id": str(rule_id) if rule_id else "",
        "server_id": str(server_id) if server_id else "",
        "event_type": event_type if event_type in EVENT_TYPES else "",
    }
    offset = _offset(request.query.get("offset"))
    rules = await call(request, alerts_api.list_rules)
    servers = await call(request, servers_api.list_servers, query=ServerQuery())
    query = EventsQuery(
        rule_id=rule_id,
        server_id=server_id,
        event_type=filters["event_type"] or None,
        limit=PAGE_SIZE,
        offset=offset,
    )
    events = await call(request, alerts_api.list_events, query=query)
    items, total = events["items"], events["total"]
    if not items and total:  # past the last page (events were deleted meanwhile)
        last = (total - 1) // PAGE_SIZE * PAGE_SIZE
        return redirect(page_url("/alerts", filters, last, "#events"))
    server_names = {s["id"]: s["name"] for s in servers}
    return {
        "section": "alerts",
        "rules": [_rule_row(rule, server_names) for rule in rules],
        "servers": servers,
        "event_types": EVENT_TYPES,
        "filters": filters,
        "filtered": any(filters.values()),
        "events": items,
        "page": pager("/alerts", filters, offset, len(items), total, "#events"),
    }


@pages.get("/alerts/rules/new", "alert_rule_form.html")
async def new_rule_page(request: web.Request) -> dict[str, Any]:
    await authorize(request, alerts_api.create_rule)
    return await _form(request, None, dict(_NEW_RULE), {})


@pages.post("/alerts/rules/new")
async def create_rule(request: web.Request) -> web.StreamResponse:
    await authorize(request, alerts_api.create_rule)
    values = _typed(request)
    try:
        body = validated(RuleIn, _body(values))
        await call(request, alerts_api.create_rule, body=body)
    except FormInvalid as exc:
        return await _refused(request, None, values, exc.errors, 422)
    except ApiError as exc:  # the chosen server was deleted meanwhile (404)
        if isinstance(exc, Forbidden) or exc.status >= 500:
            raise
        return await _refused(request, None, values, api_errors(exc), exc.status)
    return redirect("/alerts")


@pages.get("/alerts/rules/{rule_id}/edit", "alert_rule_form.html")
async def edit_rule_page(request: web.Request) -> dict[str, Any]:
    rule_id = path_id(request, "rule_id", "rule")
    await authorize(request, alerts_api.update_rule)
    rule = await call(request, alerts_api.get_rule, rule_id=rule_id)
    return await _form(request, rule, _stored(rule), {})


@pages.post("/alerts/rules/{rule_id}/edit")
async def update_rule(request: web.Request) -> web.StreamResponse:
    rule_id = path_id(request, "rule_id", "rule")
    await authorize(request, alerts_api.update_rule)
    rule = await call(request, alerts_api.get_rule, rule_id=rule_id)
    values = _typed(request)
    try:
        # Every field of the form is sent, so an emptied URL is set to null: cleared.
        body = validated(RulePatch, _body(values))
        await call(request, alerts_api.update_rule, rule_id=rule_id, body=body)
    except FormInvalid as exc:
        return await _refused(request, rule, values, exc.errors, 422)
    except ApiError as exc:  # the chosen server, or the rule, was deleted meanwhile (404)
        if isinstance(exc, Forbidden) or exc.status >= 500:
            raise
        return await _refused(request, rule, values, api_errors(exc), exc.status)
    return redirect("/alerts")


@pages.post("/alerts/rules/{rule_id}/delete")
async def delete_rule(request: web.Request) -> web.StreamResponse:
    rule_id = path_id(request, "rule_id", "rule")
    await call(request, alerts_api.delete_rule, rule_id=rule_id)
    return redirect("/alerts")


@pages.get("/alerts/events/{event_id}", "alert_event.html")
async def event_page(request: web.Request) -> dict[str, Any]:
    event_id = path_id(request, "event_id", "event")
    event = await call(request, alerts_api.get_event, event_id=event_id)
    # An event goes with its rule, so the rule is there (as it is now, maybe edited since).
    rule = await call(request, alerts_api.get_rule, rule_id=event["rule_id"])
    deliveries = await call(request, alerts_api.list_deliveries, event_id=event_id)
    return {
        "section": "alerts",
        "event": event,
        "rule": _rule_row(rule, {}),
        "deliveries": deliveries,
    }


# -- helpers ----------------------------------------------------------------------------------


def _typed(request: web.Request) -> dict[str, Any]:
    """The rule form's values as typed, to show again if refused."""
    values: dict[str, Any] = {name: field_text(request, name) for name in _TEXT_FIELDS}
    # An unticked checkbox is not sent at all.
    values["enabled"] = field_text(request, "enabled") == "true"
    return values


def _body(values: dict[str, Any]) -> dict[str, Any]:
    """The form's values as the API's request body."""
    body = dict(values)
    for name in _EMPTY_IS_NULL:
        body[name] = body[name].strip() or None
    return body


def _stored(rule: dict[str, Any]) -> dict[str, Any]:
    """A stored rule as the form's values."""
    values: dict[str, Any] = {name: rule[name] for name in _TEXT_FIELDS}
    values.update(
        server_id=str(rule["server_id"]) if rule["server_id"] else "",
        threshold=_number_text(rule["threshold"]),
        window_minutes=str(rule["window_minutes"]),
        slack_webhook_url=rule["slack_webhook_url"] or "",
        webhook_url=rule["webhook_url"] or "",
        enabled=rule["enabled"],
    )
    return values


async def _form(
    request: web.Request,
    rule: dict[str, Any] | None,
    values: dict[str, Any],
    errors: dict[str, str],
) -> dict[str, Any]:
    servers = await call(request, servers_api.list_servers, query=ServerQuery())
    return {
        "section": "alerts",
        "rule": rule,
        "values": values,
        "errors": errors,
        "action": "/alerts/rules/new" if rule is None else f"/alerts/rules/{rule['id']}/edit",
        "server_options": [("", "All servers (each on its own)")]
        + [(str(s["id"]), s["name"]) for s in servers],
        "metric_options": METRICS,
        "operator_options": OPERATORS,
    }


async def _refused(
    request: web.Request,
    rule: dict[str, Any] | None,
    values: dict[str, Any],
    errors: dict[str, str],
    status: int,
) -> web.StreamResponse:
    context = await _form(request, rule, values, errors)
    return await render(request, "alert_rule_form.html", context, status=status)


def _rule_row(rule: dict[str, Any], server_names: dict[Any, str]) -> dict[str, Any]:
    """A rule as the pages show it; of its URLs only the host, as a Slack webhook's path is
    its secret."""
    targets = [
        (kind, urlsplit(url).hostname or "")
        for kind, url in (("Webhook", rule["webhook_url"]), ("Slack", rule["slack_webhook_url"]))
        if url
    ]
    server_id = rule["server_id"]
    return {
        **rule,
        "server_name": None if server_id is None else server_names.get(server_id, "a server"),
        "condition": (
            f"{rule['metric']} {rule['operator']} {_number_text(rule['threshold'])} "
            f"over {rule['window_minutes']} min"
        ),
        "targets": targets,
    }


def _number_text(value: float) -> str:
    """3.0 as "3", 0.05 as "0.05": what a person would type."""
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else str(value)


def _offset(raw: str | None) -> int:
    try:
        return min(max(0, int(raw or "0")), BIGINT_MAX)
    except ValueError:
        return 0
