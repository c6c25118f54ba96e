"""Retention: what is older than its configured period is removed, hourly, without holding
anything up. Raw tool calls go a UTC day at a time (their partitions, detached CONCURRENTLY and
dropped), after the coming days' partitions are made; their hourly rollups, alert events,
health checks and tool changes (kept as long as alert events) go in small batches. Tasks the
proxy followed that expired with no end seen become their calls' rows (gateway/proxy/tasks).
Expired OAuth codes and refresh tokens go, and clients nobody consented to (gateway/db/oauth)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import asyncpg
from aiohttp import web

from gateway.calllog.writer import CALL_LOG, CallLog
from gateway.config import Settings
from gateway.db import alerts as alerts_db
from gateway.db import health_checks as health_checks_db
from gateway.db import oauth as oauth_db
from gateway.db import partitions
from gateway.db import rate_limits as rate_limits_db
from gateway.db import rollups as rollups_db
from gateway.db import server_tools as server_tools_db
from gateway.db.rollups import floor_hour
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.keys import POOL, SETTINGS
from gateway.proxy import tasks as proxy_tasks

log = logging.getLogger(__name__)

BATCH_SIZE = 1000
# Between batches, so pruning a backlog never holds locks or the disk for long.
PAUSE_SECONDS = 0.1
EVERY_SECONDS = 3600.0
# The longest window of the analytics endpoints: rollups are never pruned inside it.
ANALYTICS_DAYS = 30


async def _in_batches(delete: Callable[[], Awaitable[int]], batch_size: int, pause: float) -> int:
    """Run `delete` (one batch, returning how many rows it removed) until a batch comes back
    short; returns the total."""
    total = 0
    while True:
        deleted = await delete()
        total += deleted
        if deleted < batch_size:
            return total
        await asyncio.sleep(pause)


async def prune_old_checks(
    pool: asyncpg.Pool,
    retention_days: int,
    *,
    batch_size: int = BATCH_SIZE,
    pause: float = PAUSE_SECONDS,
) -> int:
    """Delete every check older than `retention_days`; returns how many were deleted."""
    cutoff = datetime.now(UTC) - timedelta(days=retention_days)
    return await _in_batches(
        lambda: health_checks_db.prune(pool, cutoff, batch_size), batch_size, pause
    )


def rollup_cutoff(settings: Settings, now: datetime) -> datetime:
    """Rollup hours before this go. Never one whose raw calls are still listed (list totals
    add up rollups wherever calls are listed) nor one inside the analytics' 30 days, whatever
    the configuration says."""
    days = max(settings.rollup_retention_days, settings.tool_call_retention_days, ANALYTICS_DAYS)
    return floor_hour(now - timedelta(days=days))


async def prune_rollups(
    pool: asyncpg.Pool,
    settings: Settings,
    now: datetime,
    *,
    batch_size: int = BATCH_SIZE,
    pause: float = PAUSE_SECONDS,
) -> int:
    """Delete the rollup rows of hours before rollup_cutoff(); returns how many."""
    before = rollup_cutoff(settings, now)
    total = 0
    for table in rollups_db.TABLES:
        delete = functools.partial(rollups_db.prune, pool, table, before, batch_size)
        total += await _in_batches(delete, batch_size, pause)
    return total


async def prune_alert_events(
    pool: asyncpg.Pool,
    settings: Settings,
    now: datetime,
    *,
    batch_size: int = BATCH_SIZE,
    pause: float = PAUSE_SECONDS,
) -> int:
    """Delete alert events (with their deliveries) older than the alert retention, except open
    incidents and events whose notifications are still being tried; returns how many."""
    before = now - timedelta(days=settings.alert_retention_days)
    return await _in_batches(
        lambda: alerts_db.prune_events(pool, before, batch_size), batch_size, pause
    )


async def maintain_partitions(
    pool: asyncpg.Pool, settings: Settings, now: datetime
) -> tuple[list[str], list[str]]:
    """Make the coming days' partitions of tool_calls, then drop the expired ones; returns the
    names created and dropped. Creating comes first: it must not wait behind a long detach."""
    keep_days = settings.tool_call_retention_days
    async with pool.acquire() as conn:
        created = await partitions.create_ahead(conn, now, keep_days)
        dropped = await partitions.drop_expired(conn, now, keep_days)
    return created, dropped


@dataclass(slots=True)
class Round:
    """What one round of retention did."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    rollup_rows: int = 0
    alert_events: int = 0
    health_checks: int = 0
    rate_limit_hits: int = 0
    expired_tasks: int = 0
    # Expired OAuth codes and refresh tokens, and clients nobody uses (gateway/oauth).
    oauth_rows: int = 0
    tool_changes: int = 0
    # The steps that failed (each is logged); the others ran all the same.
    failed: list[str] = field(default_factory=list)


async def run_once(
    pool: asyncpg.Pool,
    settings: Settings,
    *,
    now: datetime | None = None,
    batch_size: int = BATCH_SIZE,
    pause: float = PAUSE_SECONDS,
    call_log: CallLog | None = None,
) -> Round:
    """One round of every kind of retention; a step that fails does not stop the others.
    Expired tasks are swept only with the `call_log` their calls' rows go to."""
    now = datetime.now(UTC) if now is None else now
    done = Round()

    async def step(name: str, work: Awaitable[None]) -> None:
        try:
            await work
        except DATABASE_ERRORS as exc:
            done.failed.append(name)
            log.warning("retention of %s failed: %s: %s", name, type(exc).__name__, exc)
        except Exception:
            done.failed.append(name)
            log.exception("retention of %s failed", name)

    async def tool_calls() -> None:
        done.created, done.dropped = await maintain_partitions(pool, settings, now)

    async def rollups() -> None:
        done.rollup_rows = await prune_rollups(
            pool, settings, now, batch_size=batch_size, pause=pause
        )

    async def alert_events() -> None:
        done.alert_events = await prune_alert_events(
            pool, settings, now, batch_size=batch_size, pause=pause
        )

    async def health_checks() -> None:
        done.health_checks = await prune_old_checks(
            pool, settings.health_retention_days, batch_size=batch_size, pause=pause
        )

    await step("tool call partitions", tool_calls())
    await step("tool call rollups", rollups())
    await step("alert events", alert_events())

    async def rate_limits() -> None:
        done.rate_limit_hits = await _in_batches(
            lambda: rate_limits_db.prune(pool, batch_size), batch_size, pause
        )

    async def tool_changes() -> None:
        # Kept as long as alert events: both are the record of what happened to a server.
        before = now - timedelta(days=settings.alert_retention_days)
        done.tool_changes = await _in_batches(
            lambda: server_tools_db.prune(pool, before, batch_size), batch_size, pause
        )

    await step("health checks", health_checks())
    await step("rate limit attempts", rate_limits())

    async def oauth() -> None:
        for prune in (oauth_db.prune_codes, oauth_db.prune_refresh_tokens, oauth_db.prune_clients):
            done.oauth_rows += await _in_batches(
                functools.partial(prune, pool, batch_size), batch_size, pause
            )

    await step("OAuth codes, refresh tokens and clients", oauth())
    await step("tool changes", tool_changes())
    if call_log is not None:

        async def expired_tasks() -> None:
            done.expired_tasks = await proxy_tasks.expire(pool, call_log, now, batch_size, pause)

        await step("expired tasks", expired_tasks())
    return done


async def run_retention(pool: asyncpg.Pool, settings: Settings, call_log: CallLog) -> None:
    """Every EVERY_SECONDS, starting at once (a gateway that was down catches up first)."""
    while True:
        done = await run_once(pool, settings, call_log=call_log)
        if (
            done.dropped
            or done.rollup_rows
            or done.alert_events
            or done.health_checks
            or done.expired_tasks
        ):
            log.info(
                "retention: dropped tool call days %s, %d rollup rows, %d alert events, "
                "%d health checks; logged %d calls whose tasks expired unseen",
                ", ".join(done.dropped) or "(none)",
                done.rollup_rows,
                done.alert_events,
                done.health_checks,
                done.expired_tasks,
            )
        await asyncio.sleep(EVERY_SECONDS)


async def run(app: web.Application) -> None:
    """The loop as the app starts it."""
    await run_retention(app[POOL], app[SETTINGS], app[CALL_LOG])
