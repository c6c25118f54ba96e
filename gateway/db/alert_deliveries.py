"""SQL for the notification outbox: claiming deliveries that are due and recording attempts."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.db.types import Executor


@dataclass(frozen=True, slots=True)
class DueDelivery:
    id: uuid.UUID
    target: str
    url: str
    payload: dict[str, Any]
    # Attempts made before this one.
    attempt_count: int


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

# Claiming pushes next_attempt_at past the send's timeout (the lease): other processes skip the
# row meanwhile, and if this one dies mid-send the row comes due again and is retried.
_CLAIM = f"""
WITH due AS (
    SELECT d.id FROM alert_deliveries AS d
    WHERE d.next_attempt_at <= now() AND {_READY}
    ORDER BY d.next_attempt_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE alert_deliveries AS d SET next_attempt_at = now() + make_interval(secs => $1)
FROM due WHERE d.id = due.id
RETURNING d.id, d.target, d.url, d.payload, d.attempt_count
"""

_SECONDS_TO_NEXT = f"""
SELECT extract(epoch FROM min(d.next_attempt_at) - now())::float8
FROM alert_deliveries AS d WHERE {_READY}
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


async def claim_due(db: Executor, lease_seconds: float, limit: int) -> list[DueDelivery]:
    rows = await db.fetch(_CLAIM, lease_seconds, limit)
    return [DueDelivery(**dict(row)) for row in rows]


async def seconds_to_next(db: Executor) -> float | None:
    """How long until the next delivery comes due (<= 0: now); None when nothing is pending."""
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
