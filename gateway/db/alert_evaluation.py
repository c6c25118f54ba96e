"""SQL for the alert evaluator: claiming due rules, and moving a (rule, server) between OK and
FIRING together with the notifications that go with it (the outbox, in the same transaction)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.db.types import Connection, Executor


@dataclass(frozen=True, slots=True)
class DueRule:
    id: uuid.UUID
    workspace_id: uuid.UUID
    workspace_name: str
    server_id: uuid.UUID | None
    name: str
    metric: str
    operator: str
    threshold: float
    window_minutes: int
    slack_webhook_url: str | None
    webhook_url: str | None
    enabled: bool
    created_at: datetime
    updated_at: datetime
    # The database's clock when the rule was claimed: the end of the metric's window.
    claimed_at: datetime


@dataclass(frozen=True, slots=True)
class Incident:
    """An open FIRING event."""

    id: uuid.UUID
    fired_at: datetime
    metric_value: float


@dataclass(frozen=True, slots=True)
class Target:
    """A server the rule is evaluated on, or one it no longer covers but has an incident on."""

    server_id: uuid.UUID
    server_name: str
    in_scope: bool
    incident: Incident | None


@dataclass(frozen=True, slots=True)
class Notification:
    target: str  # 'webhook' or 'slack'
    url: str
    payload: dict[str, Any]


# Due rules in turns between workspaces (every workspace's most overdue rule, then every
# workspace's second, ...), so a workspace with hundreds of rules is evaluated beside the others
# rather than before them. SKIP LOCKED: another process takes the next ones in turn meanwhile.
_CLAIM = """
WITH turns AS (
    SELECT id, next_eval_at,
           row_number() OVER (PARTITION BY workspace_id ORDER BY next_eval_at, id) AS turn
    FROM alert_rules
    WHERE enabled AND next_eval_at <= now()
),
due AS (
    SELECT r.id FROM alert_rules AS r JOIN turns AS t ON t.id = r.id
    WHERE r.enabled AND r.next_eval_at <= now()
    ORDER BY t.turn, t.next_eval_at
    LIMIT $2
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE alert_rules AS r SET next_eval_at = now() + make_interval(secs => $1)
FROM due, workspaces AS w
WHERE r.id = due.id AND w.id = r.workspace_id
RETURNING r.id, r.workspace_id, w.name AS workspace_name, r.server_id, r.name, r.metric,
          r.operator, r.threshold, r.window_minutes, r.slack_webhook_url, r.webhook_url,
          r.enabled, r.created_at, r.updated_at, now() AS claimed_at
"""

# Servers of the rule, plus any server it has an open incident on but no longer covers (the
# rule was narrowed to one server), so that incident is resolved rather than left open forever.
_TARGETS = """
SELECT s.id AS server_id, s.name AS server_name,
       ($2::uuid IS NULL OR s.id = $2) AS in_scope,
       e.id AS incident_id, e.fired_at, e.metric_value
FROM servers AS s
LEFT JOIN alert_events AS e
       ON e.rule_id = $3 AND e.server_id = s.id AND e.event_type = 'FIRING'
          AND e.resolved_at IS NULL
WHERE s.workspace_id = $1 AND ($2::uuid IS NULL OR s.id = $2 OR e.id IS NOT NULL)
ORDER BY s.name
"""

# Only while the rule is still enabled: it may have been switched off since it was claimed.
# The partial unique index keeps a second process (or a late round) from opening another one.
_FIRE = """
INSERT INTO alert_events (workspace_id, rule_id, server_id, event_type, metric_value, fired_at)
SELECT r.workspace_id, r.id, $2, 'FIRING', $3, now()
FROM alert_rules AS r WHERE r.id = $1 AND r.enabled
ON CONFLICT (rule_id, server_id) WHERE event_type = 'FIRING' AND resolved_at IS NULL DO NOTHING
RETURNING id, fired_at, resolved_at
"""

# Closing the incident and adding its RESOLVED event is one statement: only the process whose
# UPDATE found the incident still open adds the event.
_RESOLVE = """
WITH closed AS (
    UPDATE alert_events SET resolved_at = now()
    WHERE id = $1 AND event_type = 'FIRING' AND resolved_at IS NULL
    RETURNING workspace_id, rule_id, server_id, fired_at, resolved_at
)
INSERT INTO alert_events (workspace_id, rule_id, server_id, event_type, metric_value, fired_at,
                          resolved_at)
SELECT workspace_id, rule_id, server_id, 'RESOLVED', $2, fired_at, resolved_at FROM closed
RETURNING id, fired_at, resolved_at
"""

_QUEUE = """
INSERT INTO alert_deliveries (event_id, workspace_id, rule_id, server_id, target, url, payload)
SELECT e.id, e.workspace_id, $2, $3, $4, $5, $6 FROM alert_events e WHERE e.id = $1
"""


async def claim_due_rules(pool: Executor, interval_seconds: float, limit: int) -> list[DueRule]:
    """Rules due for evaluation, each moved one interval forward so no other process takes it."""
    rows = await pool.fetch(_CLAIM, interval_seconds, limit)
    return [DueRule(**dict(row)) for row in rows]


async def targets(db: Executor, rule: DueRule) -> list[Target]:
    rows = await db.fetch(_TARGETS, rule.workspace_id, rule.server_id, rule.id)
    return [
        Target(
            row["server_id"],
            row["server_name"],
            row["in_scope"],
            None
            if row["incident_id"] is None
            else Incident(row["incident_id"], row["fired_at"], row["metric_value"]),
        )
        for row in rows
    ]


async def fire(
    conn: Connection, rule_id: uuid.UUID, server_id: uuid.UUID, metric_value: float
) -> dict[str, Any] | None:
    """Open an incident; None if one is open already or the rule is gone or disabled.
    Call inside a transaction that also queues its notifications."""
    row = await conn.fetchrow(_FIRE, rule_id, server_id, metric_value)
    return None if row is None else dict(row)


async def resolve(
    conn: Connection, incident_id: uuid.UUID, metric_value: float
) -> dict[str, Any] | None:
    """Close an incident and add its RESOLVED event; None if it was closed meanwhile."""
    row = await conn.fetchrow(_RESOLVE, incident_id, metric_value)
    return None if row is None else dict(row)


async def queue(
    conn: Connection,
    event_id: uuid.UUID,
    rule_id: uuid.UUID,
    server_id: uuid.UUID,
    notifications: Sequence[Notification],
) -> None:
    await conn.executemany(
        _QUEUE,
        [(event_id, rule_id, server_id, n.target, n.url, n.payload) for n in notifications],
    )
