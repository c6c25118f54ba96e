"""Sending alert notifications from the outbox (alert_deliveries), with retries and backoff.

The evaluator writes a delivery row in the same transaction as its event and only wakes this
loop, so a slow or failing receiver never holds up evaluation, and a notification not yet sent
when the process stops is sent by whichever process runs next. Each attempt is recorded (status
code or error) for GET /alerts/events/{id}/deliveries. Delivery is at least once: a process
that dies between sending and recording leaves the row to be sent again after its lease.

Sending is a pipeline: up to `concurrency` sends in flight, a new one claimed as soon as a slot
frees up, never waiting for the slow ones. The slots are shared in turns between workspaces,
at most `per_workspace` of one workspace's in flight and `per_host` of those to one destination
host, so a tenant's receivers that never answer (each send bounded by the timeout) hold only
their own share, and one dead host only part of a workspace's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp
import asyncpg
import orjson
from aiohttp import web

from gateway.config import Settings
from gateway.db import alert_deliveries as deliveries_db
from gateway.db.alert_deliveries import Attempt, DueDelivery, Shares
from gateway.db.alert_evaluation import DueRule, Notification
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.keys import HTTP, POOL, SETTINGS
from gateway.ops.metrics import METRICS, Metrics
from gateway.ops.tracing import (
    ALERT_ATTEMPT,
    ALERT_CHANNEL,
    ALERT_DELIVERY,
    ALERT_RESULT,
    ALERT_RULE,
    HTTP_METHOD,
    STATUS_CODE,
    TRACING,
    WORKSPACE,
    Tracing,
    peer,
    set_failed,
)

log = logging.getLogger(__name__)

# A backstop for deliveries queued by other processes (this process's evaluator wakes the loop).
POLL_SECONDS = 5.0
MIN_SLEEP_SECONDS = 0.02
# How much of an error response body an attempt keeps.
ERROR_BODY_CHARS = 300
USER_AGENT = "mcp-gateway-alerts"


@dataclass(frozen=True, slots=True)
class DeliveryPolicy:
    timeout_seconds: float = 10.0
    max_attempts: int = 8
    # The wait after the first failure; it doubles after each further one, up to max_backoff.
    backoff_seconds: float = 15.0
    max_backoff_seconds: float = 3600.0
    # Sends in flight at once in one process: in all, of one workspace, and of one destination
    # host of a workspace (half the workspace's share, rounded up: a dead host leaves the rest
    # to the workspace's other receivers).
    concurrency: int = 20
    per_workspace: int = 4
    per_host: int = 2

    @classmethod
    def from_settings(cls, settings: Settings) -> DeliveryPolicy:
        per_workspace = settings.notifications_per_workspace
        return cls(
            timeout_seconds=settings.alert_webhook_timeout_seconds,
            max_attempts=settings.alert_webhook_max_attempts,
            backoff_seconds=settings.alert_webhook_backoff_seconds,
            concurrency=settings.notifier_concurrency,
            per_workspace=per_workspace,
            per_host=(per_workspace + 1) // 2,
        )

    @property
    def shares(self) -> Shares:
        return Shares(self.concurrency, self.per_workspace, self.per_host)

    @property
    def lease_seconds(self) -> float:
        return self.timeout_seconds + 60.0

    def retry_in(self, attempts_made: int) -> float:
        return min(self.backoff_seconds * 2.0 ** (attempts_made - 1), self.max_backoff_seconds)

    def verdict(self, attempt: Attempt, number: int) -> tuple[str, float]:
        """The delivery's status after its attempt `number`, and the seconds to its retry."""
        if attempt.delivered:
            return "delivered", 0.0
        if number >= self.max_attempts:
            return "failed", 0.0
        return "pending", self.retry_in(number)


# -- payloads ----------------------------------------------------------------------------------


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat()


def rule_document(rule: DueRule) -> dict[str, Any]:
    """The rule as GET /alerts/rules shows it."""
    return {
        "id": str(rule.id),
        "name": rule.name,
        "server_id": None if rule.server_id is None else str(rule.server_id),
        "metric": rule.metric,
        "operator": rule.operator,
        "threshold": rule.threshold,
        "window_minutes": rule.window_minutes,
        "slack_webhook_url": rule.slack_webhook_url,
        "webhook_url": rule.webhook_url,
        "enabled": rule.enabled,
        "created_at": _iso(rule.created_at),
        "updated_at": _iso(rule.updated_at),
    }


def event_document(
    rule: DueRule,
    server_id: Any,
    server_name: str,
    event_type: str,
    metric_value: float,
    event: Mapping[str, Any],
) -> dict[str, Any]:
    """The event as GET /alerts/events shows it; `event` is its row (id, fired_at, resolved_at)."""
    return {
        "id": str(event["id"]),
        "rule_id": str(rule.id),
        "rule_name": rule.name,
        "server_id": str(server_id),
        "server_name": server_name,
        "event_type": event_type,
        "metric_value": metric_value,
        "fired_at": _iso(event["fired_at"]),
        "resolved_at": _iso(event["resolved_at"]),
    }


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def _slack_escape(text: str) -> str:
    # Slack's mrkdwn reads these three as control characters.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(rule: DueRule, event: Mapping[str, Any]) -> str:
    """One line, e.g. `[FIRING] High errors on "billing": error_rate is 0.25 (threshold > 0.1,
    last 5 min) in workspace Acme`."""
    line = (
        f'[{event["event_type"]}] {rule.name} on "{event["server_name"]}": '
        f"{rule.metric} is {_number(event['metric_value'])} "
        f"(threshold {rule.operator} {_number(rule.threshold)}, last {rule.window_minutes} min) "
        f"in workspace {rule.workspace_name}"
    )
    return _slack_escape(line)


def notifications(rule: DueRule, event: dict[str, Any]) -> list[Notification]:
    """What to send, and where, for an event (the output of event_document)."""
    queued = []
    if rule.webhook_url is not None:
        payload = {
            "event": event,
            "rule": rule_document(rule),
            "workspace": {"id": str(rule.workspace_id), "name": rule.workspace_name},
        }
        queued.append(Notification("webhook", rule.webhook_url, payload))
    if rule.slack_webhook_url is not None:
        queued.append(
            Notification("slack", rule.slack_webhook_url, {"text": slack_text(rule, event)})
        )
    return queued


# -- sending -----------------------------------------------------------------------------------


def _headers(delivery: DueDelivery) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        # Lets a receiver drop the duplicate of an at-least-once delivery.
        "X-Alert-Delivery-Id": str(delivery.id),
    }


async def _post(
    http: aiohttp.ClientSession,
    delivery: DueDelivery,
    timeout_seconds: float,
    headers: dict[str, str] | None = None,
) -> Attempt:
    attempted_at = datetime.now(UTC)
    started = time.perf_counter()
    status_code: int | None = None
    error: str | None = None
    try:
        async with http.post(
            delivery.url,
            data=orjson.dumps(delivery.payload),
            headers=_headers(delivery) if headers is None else headers,
            timeout=aiohttp.ClientTimeout(total=timeout_seconds),
            # A redirect would turn the POST into a GET elsewhere: report it instead.
            allow_redirects=False,
        ) as response:
            status_code = response.status
            if not 200 <= status_code < 300:
                body = await response.content.read(ERROR_BODY_CHARS)
                text = body.decode(errors="replace").strip()
                error = f"HTTP {status_code}" + (f": {text}" if text else "")
    except TimeoutError:
        error = f"timed out after {timeout_seconds:g} s"
    except (aiohttp.ClientError, UnicodeError) as exc:  # UnicodeError: a host IDNA cannot encode
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    duration_ms = (time.perf_counter() - started) * 1000
    return Attempt(attempted_at, duration_ms, status_code, error)


async def _deliver(
    pool: asyncpg.Pool,
    http: aiohttp.ClientSession,
    policy: DeliveryPolicy,
    delivery: DueDelivery,
    metrics: Metrics | None,
    tracing: Tracing | None = None,
) -> None:
    number = delivery.attempt_count + 1
    if tracing is None:
        attempt = await _post(http, delivery, policy.timeout_seconds)
    else:
        attempt = await _traced_post(tracing, http, policy, delivery, number)
    status, retry_in = policy.verdict(attempt, number)
    if status == "failed":
        log.warning(
            "giving up on alert notification %s to %s after %d attempts: %s",
            delivery.id,
            delivery.target,
            number,
            attempt.error,
            extra={"delivery_id": str(delivery.id)},
        )
    elif status == "pending":
        log.info(
            "alert notification %s to %s failed (attempt %d), retry in %.3g s: %s",
            delivery.id,
            delivery.target,
            number,
            retry_in,
            attempt.error,
            extra={"delivery_id": str(delivery.id)},
        )
    await deliveries_db.record_attempt(pool, delivery.id, number, attempt, status, retry_in)
    if metrics is not None:
        metrics.notifications.inc(_RESULTS[status])


# An attempt's result, as metrics and spans name it, by the delivery's status after it.
_RESULTS = {"delivered": "delivered", "pending": "retry", "failed": "failed"}


async def _traced_post(
    tracing: Tracing,
    http: aiohttp.ClientSession,
    policy: DeliveryPolicy,
    delivery: DueDelivery,
    number: int,
) -> Attempt:
    """The attempt as a CLIENT span of its own, its context sent in the POST's traceparent:
    ERROR when it failed (`result` says whether it will be retried)."""
    attributes = {
        ALERT_CHANNEL: delivery.target,
        WORKSPACE: str(delivery.workspace_id),
        ALERT_RULE: str(delivery.rule_id),
        ALERT_DELIVERY: str(delivery.id),
        ALERT_ATTEMPT: number,
        HTTP_METHOD: "POST",
        **peer(delivery.url),
    }
    headers = _headers(delivery)
    with tracing.span("alert notification", attributes, headers=headers) as span:
        attempt = await _post(http, delivery, policy.timeout_seconds, headers)
        span.set_attribute(ALERT_RESULT, _RESULTS[policy.verdict(attempt, number)[0]])
        if attempt.status_code is not None:
            span.set_attribute(STATUS_CODE, attempt.status_code)
        if not attempt.delivered:
            set_failed(span, _error_type(attempt), attempt.error)
    return attempt


def _error_type(attempt: Attempt) -> str:
    """A failed attempt's error.type: the HTTP status, `timeout`, or the client exception's
    name (what _post's error begins with)."""
    if attempt.status_code is not None:
        return str(attempt.status_code)
    error = attempt.error or ""
    return "timeout" if error.startswith("timed out") else error.partition(":")[0]


_Key = TypeVar("_Key")


class _Sends:
    """The sends this process has in flight, counted per workspace and per destination."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        http: aiohttp.ClientSession,
        policy: DeliveryPolicy,
        metrics: Metrics | None,
        tracing: Tracing | None = None,
    ) -> None:
        self.pool = pool
        self.http = http
        self.policy = policy
        self.metrics = metrics
        self.tracing = tracing
        self.running: dict[asyncio.Task[None], DueDelivery] = {}
        self.by_workspace: Counter[uuid.UUID] = Counter()
        self.by_host: Counter[tuple[uuid.UUID, str]] = Counter()

    @property
    def free(self) -> int:
        return self.policy.concurrency - len(self.running)

    async def claim(self) -> int:
        """Start sending what is due, as far as the free slots and the shares allow."""
        if self.free <= 0:
            return 0
        due = await deliveries_db.claim_due(
            self.pool,
            self.policy.lease_seconds,
            self.free,
            self.policy.shares,
            self.by_workspace,
            self.by_host,
        )
        for delivery in due:
            task = asyncio.create_task(
                _deliver(self.pool, self.http, self.policy, delivery, self.metrics, self.tracing)
            )
            self.running[task] = delivery
            self.by_workspace[delivery.workspace_id] += 1
            self.by_host[delivery.workspace_id, delivery.host] += 1
        return len(due)

    def finish(self, done: Iterable[asyncio.Task[Any]]) -> None:
        """Free the slots of sends that ended."""
        for task in done:
            delivery = self.running.pop(task)
            _uncount(self.by_workspace, delivery.workspace_id)
            _uncount(self.by_host, (delivery.workspace_id, delivery.host))
            if not task.cancelled() and (error := task.exception()) is not None:
                # Unrecorded: the lease runs out and the delivery is tried again.
                log.error("alert notification %s: %s", delivery.id, error, exc_info=error)

    async def cancel(self) -> None:
        for task in self.running:
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)
        self.running.clear()
        self.by_workspace.clear()
        self.by_host.clear()


def _uncount(counter: Counter[_Key], key: _Key) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


async def deliver_due(
    pool: asyncpg.Pool,
    http: aiohttp.ClientSession,
    policy: DeliveryPolicy,
    metrics: Metrics | None = None,
    tracing: Tracing | None = None,
) -> int:
    """Send every delivery that is due now (a new one claimed whenever a send ends, within the
    shares); returns how many attempts were made. With `tracing`, each attempt is a span."""
    sends = _Sends(pool, http, policy, metrics, tracing)
    attempted = 0
    try:
        while True:
            attempted += await sends.claim()
            if not sends.running:
                return attempted
            done, _ = await asyncio.wait(sends.running, return_when=asyncio.FIRST_COMPLETED)
            sends.finish(done)
    finally:
        await sends.cancel()


async def run_notifier(
    pool: asyncpg.Pool,
    http: aiohttp.ClientSession,
    policy: DeliveryPolicy,
    wakeup: asyncio.Event,
    metrics: Metrics | None = None,
    tracing: Tracing | None = None,
) -> None:
    """Runs until cancelled: claims what is due into the free slots, then waits until a send
    ends, the evaluator queues something (wakeup), the next retry comes due, or POLL_SECONDS
    pass, whichever is first."""
    sends = _Sends(pool, http, policy, metrics, tracing)
    woken = asyncio.create_task(wakeup.wait())
    try:
        while True:
            delay = POLL_SECONDS
            wakeup.clear()
            try:
                await sends.claim()
                if sends.free > 0:
                    # What is due now and was not claimed waits for a share, which a send that
                    # ends frees: sleep until the next row comes due.
                    seconds = await deliveries_db.seconds_to_next(pool)
                    if seconds is not None:
                        delay = min(max(seconds, MIN_SLEEP_SECONDS), POLL_SECONDS)
            except DATABASE_ERRORS as exc:
                log.warning("alert notifier: database unavailable, will retry: %s", exc)
            except Exception:
                log.exception("alert notifier round failed")
            if woken.done():
                woken = asyncio.create_task(wakeup.wait())
            waits: set[asyncio.Task[Any]] = {woken, *sends.running}
            done, _ = await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            sends.finish([task for task in done if task in sends.running])
    finally:
        woken.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await woken
        await sends.cancel()


# Set by the alert evaluator when it queued notifications: the notifier looks at once.
ALERTS_QUEUED = web.AppKey("alerts_queued", asyncio.Event)


async def run(app: web.Application) -> None:
    """The loop as the app starts it."""
    policy = DeliveryPolicy.from_settings(app[SETTINGS])
    await run_notifier(app[POOL], app[HTTP], policy, app[ALERTS_QUEUED], app[METRICS], app[TRACING])
