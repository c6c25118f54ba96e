"""Evaluating alert rules: each enabled rule, once per interval, per server it covers.

A (rule, server) is OK or FIRING, and the state is the database's: FIRING means an open
incident (a FIRING event with resolved_at null). So a restart neither fires again nor forgets,
and several gateway processes can run this loop: a rule is claimed by one of them per interval
(SKIP LOCKED on next_eval_at), and the unique index on open incidents plus the conditional
resolve keep even a late, overlapping round from firing or resolving twice.
"""

from __future__ import annotations

import asyncio
import logging
import math

import asyncpg
from aiohttp import web

from gateway.background import notifier
from gateway.background.notifier import ALERTS_QUEUED
from gateway.db import alert_evaluation as evaluation_db
from gateway.db import alert_metrics
from gateway.db.alert_evaluation import DueRule, Target
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.keys import POOL, SETTINGS
from gateway.ops.metrics import METRICS, Metrics

log = logging.getLogger(__name__)

# Rules claimed per statement; a round keeps claiming until no rule is due.
CLAIM_BATCH = 50


def holds(value: float, operator: str, threshold: float) -> bool:
    # Metrics are sums and quotients of floats, so "==" allows for the last bits of rounding.
    equal = math.isclose(value, threshold, rel_tol=1e-9, abs_tol=1e-12)
    if operator == "==":
        return equal
    if operator == ">":
        return value > threshold and not equal
    if operator == ">=":
        return value > threshold or equal
    if operator == "<":
        return value < threshold and not equal
    if operator == "<=":
        return value < threshold or equal
    raise ValueError(f"unknown operator {operator!r}")


async def _transition(
    pool: asyncpg.Pool, rule: DueRule, target: Target, value: float, *, firing: bool
) -> bool:
    """Fire or resolve, with the event's notifications queued in the same transaction."""
    async with pool.acquire() as conn, conn.transaction():
        if firing:
            row = await evaluation_db.fire(conn, rule.id, target.server_id, value)
        else:
            assert target.incident is not None
            row = await evaluation_db.resolve(conn, target.incident.id, value)
        if row is None:
            return False  # another process got there first, or the rule was switched off
        event = notifier.event_document(
            rule,
            target.server_id,
            target.server_name,
            "FIRING" if firing else "RESOLVED",
            value,
            row,
        )
        await evaluation_db.queue(
            conn, row["id"], rule.id, target.server_id, notifier.notifications(rule, event)
        )
    log.info(
        "alert %s: rule %r on server %r, %s = %s",
        event["event_type"],
        rule.name,
        target.server_name,
        rule.metric,
        value,
        extra={"rule_id": str(rule.id), "server_id": str(target.server_id)},
    )
    return True


async def evaluate_rule(pool: asyncpg.Pool, rule: DueRule, metrics: Metrics | None = None) -> int:
    """Evaluate one claimed rule on each server it covers; returns how many events it made.
    `metrics` counts each (rule, server) by result: firing, ok, no_data (or resolved: the rule
    no longer covers the server)."""
    targets = await evaluation_db.targets(pool, rule)
    window = alert_metrics.Window.ending(rule.claimed_at, rule.window_minutes)
    values = await alert_metrics.measure(pool, rule.metric, [t.server_id for t in targets], window)
    events = 0
    for target in targets:
        value = values.get(target.server_id)
        if not target.in_scope:
            # The rule no longer covers this server: its incident ends. Without a current
            # value, the RESOLVED event repeats the one it fired with.
            assert target.incident is not None
            value = target.incident.metric_value if value is None else value
            events += await _transition(pool, rule, target, value, firing=False)
            result = "resolved"
        elif value is None:
            result = "no_data"  # no data in the window: the state stays as it is
        else:
            firing = holds(value, rule.operator, rule.threshold)
            if firing != (target.incident is not None):
                events += await _transition(pool, rule, target, value, firing=firing)
            result = "firing" if firing else "ok"
        if metrics is not None:
            metrics.alert_evaluations.inc(result)
    return events


async def evaluate_due_rules(
    pool: asyncpg.Pool,
    interval_seconds: float,
    wakeup: asyncio.Event | None = None,
    metrics: Metrics | None = None,
) -> int:
    """One round: claim every rule that is due and evaluate it. Returns how many events were
    made; sets `wakeup` (the notifier's) when any notification may have been queued."""
    events = 0
    while True:
        rules = await evaluation_db.claim_due_rules(pool, interval_seconds, CLAIM_BATCH)
        for rule in rules:
            try:
                events += await evaluate_rule(pool, rule, metrics)
            except (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError):
                if metrics is not None:
                    metrics.alert_evaluations.inc("failed")
                raise  # the database is away: the round ends, the rules come due again
            except asyncpg.ForeignKeyViolationError:
                # The rule or a server was deleted while being evaluated.
                log.debug("alert rule %s vanished during evaluation", rule.id)
            except Exception:
                log.exception("evaluating alert rule %s failed", rule.id)
                if metrics is not None:
                    metrics.alert_evaluations.inc("failed")
        if events and wakeup is not None:
            wakeup.set()
        if len(rules) < CLAIM_BATCH:
            return events


async def run_alert_evaluator(
    pool: asyncpg.Pool,
    interval_seconds: float,
    wakeup: asyncio.Event | None = None,
    metrics: Metrics | None = None,
) -> None:
    """Runs until cancelled. It looks for due rules four times per interval, so a new or edited
    rule is evaluated soon; each rule is still evaluated only once per interval."""
    while True:
        try:
            await evaluate_due_rules(pool, interval_seconds, wakeup, metrics)
        except DATABASE_ERRORS as exc:
            log.warning("alert evaluation: database unavailable, will retry: %s", exc)
        except Exception:
            log.exception("alert evaluation round failed")
        await asyncio.sleep(interval_seconds / 4)


async def run(app: web.Application) -> None:
    """The loop as the app starts it: it only queues notifications and wakes the notifier
    (ALERTS_QUEUED), never waiting on one."""
    settings = app[SETTINGS]
    await run_alert_evaluator(
        app[POOL], settings.alert_eval_interval_seconds, app[ALERTS_QUEUED], app[METRICS]
    )
