"""SQL for the notification outbox: claiming deliveries that are due (in turns between
workspaces, and between a workspace's destinations) and recording attempts."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.db.types import Executor


@dataclass(frozen=True, slots=True)
class DueDelivery:
    id: uuid.UUID
    workspace_id: uuid.UUID
    # Where it goes: the URL's host[:port] in lower case (see _HOST).
    host: str
    target: str
    url: str
    payload: dict[str, Any]
    # Attempts made before this one.
    attempt_count: int
    # The rule whose event it notifies of.
    rule_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Attempt:
    attempted_at: datetime
    duration_ms: float
    status_code: int | None
    error: str | None

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


# A delivery waits while an earlier one of the same incident stream (rule, server, target) is
# still pending, so a receiver never sees RESOLVED before the FIRING that it ends.
_READY = """
d.status = 'pending'
AND NOT EXISTS (
    SELECT 1 FROM alert_deliveries AS earlier
    WHERE earlier.rule_id = d.rule_id AND earlier.server_id = d.server_id
      AND earlier.target = d.target AND earlier.status = 'pending'
      AND earlier.created_at < d.created_at
)
"""

# The destination a delivery's slots are shared by: the URL's authority (host[:port]) in lower
# case, as written (http://a.example and http://a.example:80 are two).
_HOST = r"lower(coalesce(substring(d.url FROM '^[^:/?#]+://([^/?#]*)'), ''))"

# Due deliveries, taken in turns: between workspaces (every workspace's first, then every
# workspace's second, ...), and within a workspace between its destinations, counting what this
# process already has in flight of each, and none past the shares ($3 per workspace, $4 per
# destination of a workspace). So one tenant's thousands of hanging webhooks hold only its own
# share, and one dead host only part of that. Each workspace offers its $10 most overdue ready
# deliveries (one index range each), so a claim costs the same whatever the backlog; the
# workspaces with pending deliveries are found by skipping through their index, one probe each.
# Claiming pushes next_attempt_at past the send's timeout (the lease): other processes skip the
# row meanwhile (and take the next ones in turn: the lock is taken in order, under the LIMIT),
# and if this one dies mid-send the row comes due again and is retried.
_CLAIM = f"""
WITH RECURSIVE pending (workspace_id) AS (
    (SELECT workspace_id FROM alert_deliveries WHERE status = 'pending'
     ORDER BY workspace_id LIMIT 1)
    UNION ALL
    SELECT (SELECT n.workspace_id FROM alert_deliveries AS n
            WHERE n.status = 'pending' AND n.workspace_id > p.workspace_id
            ORDER BY n.workspace_id LIMIT 1)
    FROM pending AS p WHERE p.workspace_id IS NOT NULL
),
workspace_busy AS (
    SELECT * FROM unnest($5::uuid[], $6::int[]) AS b (workspace_id, sending)
),
host_busy AS (
    SELECT * FROM unnest($7::uuid[], $8::text[], $9::int[]) AS b (workspace_id, host, sending)
),
offered AS (
    SELECT c.id, c.workspace_id, c.host, c.next_attempt_at,
           coalesce(w.sending, 0) AS workspace_sending
    FROM pending AS p
    LEFT JOIN workspace_busy AS w ON w.workspace_id = p.workspace_id
    CROSS JOIN LATERAL (
        SELECT d.id, d.workspace_id, {_HOST} AS host, d.next_attempt_at
        FROM alert_deliveries AS d
        WHERE d.workspace_id = p.workspace_id AND d.next_attempt_at <= now() AND {_READY}
        ORDER BY d.next_attempt_at
        LIMIT $10
    ) AS c
    WHERE p.workspace_id IS NOT NULL AND coalesce(w.sending, 0) < $3
),
host_turns AS (
    SELECT o.*,
           coalesce(h.sending, 0) + row_number() OVER (
               PARTITION BY o.workspace_id, o.host ORDER BY o.next_attempt_at, o.id
           ) AS host_turn
    FROM offered AS o
    LEFT JOIN host_busy AS h ON h.workspace_id = o.workspace_id AND h.host = o.host
),
turns AS (
    SELECT t.id, t.next_attempt_at,
           t.workspace_sending + row_number() OVER (
               PARTITION BY t.workspace_id ORDER BY t.host_turn, t.next_attempt_at, t.id
           ) AS turn
    FROM host_turns AS t
    WHERE t.host_turn <= $4
),
due AS (
    SELECT d.id FROM alert_deliveries AS d JOIN turns AS t ON t.id = d.id
    WHERE t.turn <= $3 AND d.status = 'pending' AND d.next_attempt_at <= now()
    ORDER BY t.turn, t.next_attempt_at
    LIMIT $2
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE alert_deliveries AS d SET next_attempt_at = now() + make_interval(secs => $1)
FROM due WHERE d.id = due.id
RETURNING d.id, d.workspace_id, {_HOST} AS host, d.target, d.url, d.payload, d.attempt_count,
          d.rule_id
"""

# Rows due now that a claim left are waiting for a share to free up, which the notifier hears
# of by itself: it sleeps until the next row that is not due yet.
_SECONDS_TO_NEXT = f"""
SELECT extract(epoch FROM min(d.next_attempt_at) - now())::float8
FROM alert_deliveries AS d WHERE d.next_attempt_at > now() AND {_READY}
"""

# $1 delivery, $2 attempt number, $3..$6 the attempt, $7 new status, $8 seconds to the retry.
_RECORD = """
WITH attempt AS (
    INSERT INTO alert_delivery_attempts (delivery_id, attempt, attempted_at, duration_ms,
                                         status_code, error)
    SELECT id, $2, $3, $4, $5, $6 FROM alert_deliveries WHERE id = $1
)
UPDATE alert_deliveries SET
    attempt_count = $2,
    status = $7,
    next_attempt_at = now() + make_interval(secs => $8),
    finished_at = CASE WHEN $7 = 'pending' THEN NULL ELSE now() END
WHERE id = $1
"""


@dataclass(frozen=True, slots=True)
class Shares:
    """How many deliveries may be in flight in one process: in all, of one workspace, and of
    one destination host of a workspace."""

    total: int
    per_workspace: int
    per_host: int


# Ready deliveries of each workspace a claim considers (its most overdue ones).
OFFERED_PER_WORKSPACE = 100


async def claim_due(
    db: Executor,
    lease_seconds: float,
    limit: int,
    shares: Shares,
    sending: Mapping[uuid.UUID, int] | None = None,
    sending_to: Mapping[tuple[uuid.UUID, str], int] | None = None,
) -> list[DueDelivery]:
    """Up to `limit` due deliveries, in turns between workspaces and their destinations, none
    past `shares` counting what is in flight: `sending` per workspace, `sending_to` per
    (workspace, host)."""
    workspaces = dict(sending or {})
    hosts = dict(sending_to or {})
    rows = await db.fetch(
        _CLAIM,
        lease_seconds,
        limit,
        shares.per_workspace,
        shares.per_host,
        list(workspaces),
        list(workspaces.values()),
        [workspace_id for workspace_id, _ in hosts],
        [host for _, host in hosts],
        list(hosts.values()),
        OFFERED_PER_WORKSPACE,
    )
    return [DueDelivery(**dict(row)) for row in rows]


async def seconds_to_next(db: Executor) -> float | None:
    """How long until the next delivery that is not due yet comes due; None when there is none."""
    value: float | None = await db.fetchval(_SECONDS_TO_NEXT)
    return value


async def record_attempt(
    db: Executor,
    delivery_id: uuid.UUID,
    number: int,
    attempt: Attempt,
    status: str,
    retry_in_seconds: float,
) -> None:
    await db.execute(
        _RECORD,
        delivery_id,
        number,
        attempt.attempted_at,
        attempt.duration_ms,
        attempt.status_code,
        attempt.error,
        status,
        retry_in_seconds,
    )
