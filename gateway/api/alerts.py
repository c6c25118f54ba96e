"""/alerts: alert rules, the events they produce, and the notifications sent for those."""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import AfterValidator, ConfigDict, Field, field_validator

from gateway.accounts.access import ADMIN, PRINCIPAL, READ
from gateway.api.models import WHOLE, Body, HttpUrl, Name, Out, Page, refuse_literal_destination
from gateway.api.routing import Routes
from gateway.db import alerts as alerts_db
from gateway.db.bounds import AtBound
from gateway.errors import BoundReached, NotFound
from gateway.keys import POOL, SETTINGS

routes = Routes("alerts")

Metric = Literal[
    "error_rate", "avg_latency_ms", "p95_latency_ms", "call_count", "server_down", "tool_changes"
]
Operator = Literal[">", ">=", "<", "<=", "=="]
EventType = Literal["FIRING", "RESOLVED"]
DeliveryTarget = Literal["webhook", "slack"]
DeliveryStatus = Literal["pending", "delivered", "failed"]


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


WebhookUrl = HttpUrl
Threshold = Annotated[float, AfterValidator(_finite)]
WindowMinutes = Annotated[int, Field(ge=1, le=1440, description="1..1440"), WHOLE]


class RuleIn(Body):
    name: Name
    server_id: uuid.UUID | None = Field(None, description="null: every server of the workspace")
    metric: Metric
    operator: Operator
    threshold: Threshold
    window_minutes: WindowMinutes
    slack_webhook_url: WebhookUrl | None = None
    webhook_url: WebhookUrl | None = None
    enabled: bool = True


_NOT_NULL = ("name", "metric", "operator", "threshold", "window_minutes", "enabled")


def _null_not_offered(schema: dict[str, Any]) -> None:
    """The document offers no null for the fields RulePatch refuses as null."""
    for name in _NOT_NULL:
        field = schema["properties"][name]
        del field["default"]
        [kind] = [choice for choice in field.pop("anyOf") if choice != {"type": "null"}]
        field.update(kind)


class RulePatch(Body):
    """Only the fields present change; server_id and the URLs may be set to null."""

    model_config = ConfigDict(json_schema_extra=_null_not_offered)

    name: Name | None = None
    server_id: uuid.UUID | None = None
    metric: Metric | None = None
    operator: Operator | None = None
    threshold: Threshold | None = None
    window_minutes: WindowMinutes | None = None
    slack_webhook_url: WebhookUrl | None = None
    webhook_url: WebhookUrl | None = None
    enabled: bool | None = None

    # Defaults are not validated, so this only sees an explicit null.
    @field_validator(*_NOT_NULL)
    @classmethod
    def _not_null(cls, value: object) -> object:
        if value is None:
            raise ValueError("may not be null")
        return value


class RuleOut(Out):
    id: uuid.UUID
    name: str
    server_id: uuid.UUID | None
    metric: Metric
    operator: Operator
    threshold: float
    window_minutes: int
    slack_webhook_url: str | None
    webhook_url: str | None
    enabled: bool
    created_at: datetime
    updated_at: datetime


class EventsQuery(Page):
    rule_id: uuid.UUID | None = None
    server_id: uuid.UUID | None = None
    event_type: EventType | None = None


class EventOut(Out):
    id: uuid.UUID
    rule_id: uuid.UUID
    rule_name: str
    server_id: uuid.UUID
    server_name: str
    event_type: EventType
    metric_value: float
    fired_at: datetime
    resolved_at: datetime | None


class EventPage(Out):
    items: list[EventOut]
    total: int


class DeliveryAttemptOut(Out):
    attempt: int
    attempted_at: datetime
    duration_ms: float
    status_code: int | None = Field(description="the receiver's HTTP status, if it answered")
    error: str | None = Field(description="why the attempt failed; null when it succeeded")


class DeliveryOut(Out):
    id: uuid.UUID
    event_id: uuid.UUID
    target: DeliveryTarget
    status: DeliveryStatus
    created_at: datetime
    next_attempt_at: datetime | None = Field(description="when the next retry is due (pending)")
    finished_at: datetime | None = Field(description="when it was delivered or given up")
    attempts: list[DeliveryAttemptOut]


@routes.get(
    "/alerts/rules", summary="Alert rules of the workspace", access=READ, response=list[RuleOut]
)
async def list_rules(request: web.Request) -> list[dict[str, Any]]:
    return await alerts_db.list_rules(request.app[POOL], request[PRINCIPAL].workspace_id)


@routes.post(
    "/alerts/rules",
    summary="Create an alert rule",
    access=ADMIN,
    status=201,
    response=RuleOut,
    errors=(404,),
)
async def create_rule(request: web.Request, body: RuleIn) -> dict[str, Any]:
    """`server_id` null means every server of the workspace (also ones added later), each
    evaluated on its own; otherwise it must be a server of the workspace (404).

    Every `GATEWAY_ALERT_EVAL_INTERVAL_SECONDS` the metric is computed per server over the last
    `window_minutes`: `error_rate` (errors / calls, 0..1), `avg_latency_ms` and `p95_latency_ms`
    (calls that reported a duration; p95 by nearest rank, within 1% once the window holds a
    whole hour), `call_count` (0 without calls), `server_down` (1 when the newest probe in the
    window is `down`, else 0), `tool_changes` (how many of the server's tools were added,
    removed or changed in the window: GET /servers/{id}/tools/changes). Without data (no
    calls, or no probe) the state does not change.
    When `metric operator threshold` starts to hold, a FIRING event is made and notifications
    are sent; when it stops, the incident is resolved (a RESOLVED event) and notified again.
    `slack_webhook_url` gets `{"text": "<one line>"}`; `webhook_url` gets
    `{"event": <alert event>, "rule": <rule>, "workspace": {"id", "name"}}`.

    A workspace holds at most GATEWAY_MAX_ALERT_RULES_PER_WORKSPACE rules (default 500): past
    that, 422."""
    workspace_id = request[PRINCIPAL].workspace_id
    _refuse_literal_targets(request, body.webhook_url, body.slack_webhook_url)
    limit = request.app[SETTINGS].max_alert_rules_per_workspace
    async with request.app[POOL].acquire() as conn, conn.transaction():
        if body.server_id is not None and not await alerts_db.lock_server(
            conn, workspace_id, body.server_id
        ):
            raise NotFound("server not found")
        try:
            return await alerts_db.create_rule(conn, workspace_id, body.model_dump(), limit)
        except AtBound:
            raise BoundReached(
                f"this workspace has {limit} alert rules",
                "GATEWAY_MAX_ALERT_RULES_PER_WORKSPACE",
                "delete one first",
            ) from None


def _refuse_literal_targets(request: web.Request, webhook: str | None, slack: str | None) -> None:
    refuse_literal_destination(request, "webhook_url", webhook)
    refuse_literal_destination(request, "slack_webhook_url", slack)


@routes.get("/alerts/rules/{rule_id}", summary="One alert rule", access=READ, response=RuleOut)
async def get_rule(request: web.Request, rule_id: uuid.UUID) -> dict[str, Any]:
    rule = await alerts_db.get_rule(request.app[POOL], request[PRINCIPAL].workspace_id, rule_id)
    if rule is None:
        raise NotFound("rule not found")
    return rule


@routes.patch(
    "/alerts/rules/{rule_id}",
    summary="Change some fields of an alert rule",
    access=ADMIN,
    response=RuleOut,
)
async def update_rule(request: web.Request, rule_id: uuid.UUID, body: RulePatch) -> dict[str, Any]:
    """Only the fields sent change. The rule is evaluated afresh at the next round; an open
    incident of a server the rule no longer covers is then resolved."""
    workspace_id = request[PRINCIPAL].workspace_id
    _refuse_literal_targets(request, body.webhook_url, body.slack_webhook_url)
    changes = body.model_dump(include=body.model_fields_set)
    async with request.app[POOL].acquire() as conn, conn.transaction():
        server_id = changes.get("server_id")
        if server_id is not None and not await alerts_db.lock_server(conn, workspace_id, server_id):
            raise NotFound("server not found")
        rule = await alerts_db.update_rule(conn, workspace_id, rule_id, changes)
    if rule is None:
        raise NotFound("rule not found")
    return rule


@routes.delete(
    "/alerts/rules/{rule_id}", summary="Delete an alert rule and its events", access=ADMIN
)
async def delete_rule(request: web.Request, rule_id: uuid.UUID) -> None:
    if not await alerts_db.delete_rule(request.app[POOL], request[PRINCIPAL].workspace_id, rule_id):
        raise NotFound("rule not found")


@routes.get("/alerts/events", summary="Alert events, newest first", access=READ, response=EventPage)
async def list_events(request: web.Request, query: EventsQuery) -> dict[str, Any]:
    """A FIRING event is an incident: open while `resolved_at` is null. When it ends, it gets
    `resolved_at` and a RESOLVED event with the same `fired_at` is added."""
    items, total = await alerts_db.list_events(
        request.app[POOL],
        request[PRINCIPAL].workspace_id,
        rule_id=query.rule_id,
        server_id=query.server_id,
        event_type=query.event_type,
        limit=query.limit,
        offset=query.offset,
    )
    return {"items": items, "total": total}


@routes.get("/alerts/events/{event_id}", summary="One alert event", access=READ, response=EventOut)
async def get_event(request: web.Request, event_id: uuid.UUID) -> dict[str, Any]:
    event = await alerts_db.get_event(request.app[POOL], request[PRINCIPAL].workspace_id, event_id)
    if event is None:
        raise NotFound("event not found")
    return event


@routes.get(
    "/alerts/events/{event_id}/deliveries",
    summary="Notifications of an event and every attempt to send them",
    access=READ,
    response=list[DeliveryOut],
)
async def list_deliveries(request: web.Request, event_id: uuid.UUID) -> list[dict[str, Any]]:
    """One delivery per notification target of the rule (`webhook`, `slack`). A failed attempt
    is retried with exponential backoff until the attempts run out (`failed`)."""
    pool = request.app[POOL]
    if await alerts_db.get_event(pool, request[PRINCIPAL].workspace_id, event_id) is None:
        raise NotFound("event not found")
    return await alerts_db.list_deliveries(pool, event_id)
