"""Retention: what is older than its configured period is removed, hourly, without holding
anything up (health checks in small batches)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import asyncpg

from gateway.config import Settings
from gateway.db import health_checks as health_checks_db

log = logging.getLogger(__name__)

BATCH_SIZE = 1000
# Between batches, so pruning a backlog never holds locks or the disk for long.
PAUSE_SECONDS = 0.1
EVERY_SECONDS = 3600.0


async def prune_old_checks(
    pool: asyncpg.Pool,
    retention_days: int,
    *,
    batch_size: int = BATCH_SIZE,
    pause: float = PAUSE_SECONDS,
) -> int:
    """Delete every check older than `retention_days`; returns how many were deleted."""
    cutoff = datetime.now(UTC) - timedelta(days=retention_days)
    total = 0
    while True:
        deleted = await health_checks_db.prune(pool, cutoff, batch_size)
        total += deleted
        if deleted < batch_size:
            return total
        await asyncio.sleep(pause)


async def run_retention(pool: asyncpg.Pool, settings: Settings) -> None:
    retention_days = settings.health_retention_days
    while True:
        try:
            deleted = await prune_old_checks(pool, retention_days)
            if deleted:
                log.info("pruned %d health checks older than %d days", deleted, retention_days)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("health check retention cannot reach the database: %s", exc)
        except Exception:
            log.exception("health check retention failed")
        await asyncio.sleep(EVERY_SECONDS)
