"""SQL for alert rules, for reading alert events and their notification deliveries, and for
letting old events go (retention)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gateway.db.bounds import make_room
from gateway.db.types import Connection, Executor

RULE_COLUMNS = (
    "id, name, server_id, metric, operator, threshold, window_minutes, slack_webhook_url, "
    "webhook_url, enabled, created_at, updated_at"
)

# The columns a client may set; also the whitelist for building a partial UPDATE.
RULE_FIELDS = (
    "name",
    "server_id",
    "metric",
    "operator",
    "threshold",
    "window_minutes",
    "slack_webhook_url",
    "webhook_url",
    "enabled",
)

_LIST_RULES = f"""
SELECT {RULE_COLUMNS} FROM alert_rules WHERE workspace_id = $1 ORDER BY created_at, id
"""

_GET_RULE = f"SELECT {RULE_COLUMNS} FROM alert_rules WHERE id = $1 AND workspace_id = $2"

_INSERT_RULE = f"""
INSERT INTO alert_rules (workspace_id, {", ".join(RULE_FIELDS)})
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
RETURNING {RULE_COLUMNS}
"""

_DELETE_RULE = "DELETE FROM alert_rules WHERE id = $1 AND workspace_id = $2 RETURNING id"

_COUNT_RULES = "SELECT count(*) FROM alert_rules WHERE workspace_id = $1"

# Locks the server against deletion until the rule that names it is written.
_LOCK_SERVER = "SELECT id FROM servers WHERE id = $1 AND workspace_id = $2 FOR KEY SHARE"

# rule_name and server_name are the current names: events go when their rule or server does.
_EVENT_COLUMNS = """
e.id, e.rule_id, r.name AS rule_name, e.server_id, s.name AS server_name, e.event_type,
e.metric_value, e.fired_at, e.resolved_at
"""

_EVENT_FILTERS = """
e.workspace_id = $1
AND ($2::uuid IS NULL OR e.rule_id = $2)
AND ($3::uuid IS NULL OR e.server_id = $3)
AND ($4::text IS NULL OR e.event_type = $4)
"""

_LIST_EVENTS = f"""
SELECT {_EVENT_COLUMNS}
FROM alert_events e
JOIN alert_rules r ON r.id = e.rule_id
JOIN servers s ON s.id = e.server_id
WHERE {_EVENT_FILTERS}
ORDER BY e.created_at DESC, e.id DESC
LIMIT $5 OFFSET $6
"""

_COUNT_EVENTS = f"SELECT count(*) FROM alert_events e WHERE {_EVENT_FILTERS}"

# Incidents still open (the dashboard's "is anything wrong?"): few rows, by the unique index's
# predicate, newest first.
_OPEN_INCIDENTS = f"""
SELECT {_EVENT_COLUMNS}, r.metric, r.operator, r.threshold
FROM alert_events e
JOIN alert_rules r ON r.id = e.rule_id
JOIN servers s ON s.id = e.server_id
WHERE e.workspace_id = $1 AND e.event_type = 'FIRING' AND e.resolved_at IS NULL
ORDER BY e.fired_at DESC
LIMIT 100
"""

_GET_EVENT = f"""
SELECT {_EVENT_COLUMNS}
FROM alert_events e
JOIN alert_rules r ON r.id = e.rule_id
JOIN servers s ON s.id = e.server_id
WHERE e.id = $1 AND e.workspace_id = $2
"""

_LIST_DELIVERIES = """
SELECT id, event_id, target, status, created_at, finished_at,
       CASE WHEN status = 'pending' THEN next_attempt_at END AS next_attempt_at
FROM alert_deliveries WHERE event_id = $1
ORDER BY created_at, target
"""

_LIST_ATTEMPTS = """
SELECT a.delivery_id, a.attempt, a.attempted_at, a.duration_ms, a.status_code, a.error
FROM alert_delivery_attempts a JOIN alert_deliveries d ON d.id = a.delivery_id
WHERE d.event_id = $1
ORDER BY a.attempt
"""

# Retention: one batch of the oldest events before $1. Never an open incident (it is still
# going on, whatever its age), nor an event whose notification is still being tried; their
# deliveries and attempts go with them (ON DELETE CASCADE). SKIP LOCKED: an event the
# evaluator is resolving is left for the next round instead of waited for.
_PRUNE_EVENTS = """
DELETE FROM alert_events WHERE id = ANY(ARRAY(
    SELECT e.id FROM alert_events AS e
    WHERE e.created_at < $1
      AND NOT (e.event_type = 'FIRING' AND e.resolved_at IS NULL)
      AND NOT EXISTS (
          SELECT FROM alert_deliveries AS d WHERE d.event_id = e.id AND d.status = 'pending'
      )
    ORDER BY e.created_at
    LIMIT $2
    FOR UPDATE OF e SKIP LOCKED
))
"""


async def list_rules(db: Executor, workspace_id: uuid.UUID) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetch(_LIST_RULES, workspace_id)]


async def get_rule(
    db: Executor, workspace_id: uuid.UUID, rule_id: uuid.UUID
) -> dict[str, Any] | None:
    row = await db.fetchrow(_GET_RULE, rule_id, workspace_id)
    return None if row is None else dict(row)


async def lock_server(conn: Connection, workspace_id: uuid.UUID, server_id: uuid.UUID) -> bool:
    """Whether the server belongs to the workspace; it then stays until the transaction ends."""
    return await conn.fetchval(_LOCK_SERVER, server_id, workspace_id) is not None


async def create_rule(
    conn: Connection, workspace_id: uuid.UUID, fields: Mapping[str, Any], limit: int
) -> dict[str, Any]:
    """A new rule, in the caller's transaction, unless the workspace already holds `limit`
    of them (AtBound)."""
    await make_room(conn, workspace_id, _COUNT_RULES, limit)
    row = await conn.fetchrow(_INSERT_RULE, workspace_id, *(fields[f] for f in RULE_FIELDS))
    assert row is not None
    return dict(row)


async def update_rule(
    db: Executor, workspace_id: uuid.UUID, rule_id: uuid.UUID, changes: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Sets only the given fields. The rule is due again at once, so an edit shows promptly."""
    names = [f for f in RULE_FIELDS if f in changes]
    assignments = "".join(f"{name} = ${i}, " for i, name in enumerate(names, start=3))
    sql = f"""
    UPDATE alert_rules SET {assignments}updated_at = now(), next_eval_at = now()
    WHERE id = $1 AND workspace_id = $2
    RETURNING {RULE_COLUMNS}
    """
    row = await db.fetchrow(sql, rule_id, workspace_id, *(changes[n] for n in names))
    return None if row is None else dict(row)


async def delete_rule(db: Executor, workspace_id: uuid.UUID, rule_id: uuid.UUID) -> bool:
    return await db.fetchval(_DELETE_RULE, rule_id, workspace_id) is not None


async def list_events(
    db: Executor,
    workspace_id: uuid.UUID,
    *,
    rule_id: uuid.UUID | None,
    server_id: uuid.UUID | None,
    event_type: str | None,
    limit: int,
    offset: int,
) -> tuple[list[dict[str, Any]], int]:
    filters = (workspace_id, rule_id, server_id, event_type)
    rows = await db.fetch(_LIST_EVENTS, *filters, limit, offset)
    total: int = await db.fetchval(_COUNT_EVENTS, *filters)
    return [dict(r) for r in rows], total


async def open_incidents(db: Executor, workspace_id: uuid.UUID) -> list[dict[str, Any]]:
    """FIRING events not resolved yet, with their rule's condition, newest first."""
    return [dict(r) for r in await db.fetch(_OPEN_INCIDENTS, workspace_id)]


async def get_event(
    db: Executor, workspace_id: uuid.UUID, event_id: uuid.UUID
) -> dict[str, Any] | None:
    row = await db.fetchrow(_GET_EVENT, event_id, workspace_id)
    return None if row is None else dict(row)


async def list_deliveries(db: Executor, event_id: uuid.UUID) -> list[dict[str, Any]]:
    """The event's notifications, each with every attempt to send it, oldest first."""
    deliveries = [{**r, "attempts": []} for r in await db.fetch(_LIST_DELIVERIES, event_id)]
    by_id = {d["id"]: d for d in deliveries}
    for row in await db.fetch(_LIST_ATTEMPTS, event_id):
        attempt = dict(row)
        by_id[attempt.pop("delivery_id")]["attempts"].append(attempt)
    return deliveries


async def prune_events(db: Executor, before: datetime, limit: int) -> int:
    """Delete up to `limit` alert events created before `before` (see _PRUNE_EVENTS) with their
    deliveries; returns how many events."""
    status: str = await db.execute(_PRUNE_EVENTS, before, limit)
    return int(status.rsplit(" ", 1)[1])
