"""The hourly rollups of tool calls (tool_call_hourly): their hours, and rebuilding them.

The call log writer keeps the rollups in step with tool_calls in every batch (gateway/db/
tool_calls.py). rebuild() recomputes them from the raw rows instead, for data that did not come
through the writer (a bulk COPY, a restore): the same figures and the same histograms as the
writer produces, in one transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gateway.db.types import Connection


def floor_hour(moment: datetime) -> datetime:
    """The start of the UTC hour holding `moment` (a rollup row's `hour`)."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(moment: datetime) -> datetime:
    floor = floor_hour(moment)
    return floor if floor == moment else floor + timedelta(hours=1)


# Writers (their statement upserts tool_call_hourly) wait while a rebuild runs; readers do not.
# Taken before the rebuild reads tool_calls, so every committed call is in what it reads and no
# call commits until the new rollups do.
_LOCK = "LOCK TABLE tool_call_hourly IN SHARE ROW EXCLUSIVE MODE"

# {scope} is empty (every workspace) or "AND workspace_id = $1".
_DELETE = "DELETE FROM tool_call_hourly WHERE true {scope}"

# First one row per (workspace, server, tool, hour, latency bucket) with GROUP BY, then one per
# hour with its histogram built from those (histogram_of, as the writer does): a few million
# groups for 10M calls, and no function call per call (latency_bucket() is inlined). date_bin
# gives the same UTC hour as the writer's date_trunc('hour', created_at, 'UTC'), three times
# cheaper. The hash aggregate of the first step wants memory: it spills to disk beyond work_mem.
_INSERT = """
INSERT INTO tool_call_hourly (workspace_id, server_id, tool_name, hour, call_count, error_count,
                              duration_count, duration_sum_ms, latency_histogram)
SELECT workspace_id, server_id, tool_name, hour,
       sum(calls)::bigint, sum(errors)::bigint, sum(timed)::bigint, sum(duration_sum)::bigint,
       coalesce(histogram_of(array_agg(bucket) FILTER (WHERE bucket IS NOT NULL),
                             array_agg(calls) FILTER (WHERE bucket IS NOT NULL)), '{{}}')
FROM (
    SELECT workspace_id, server_id, tool_name,
           date_bin('1 hour', created_at, '2000-01-01 00:00:00+00') AS hour,
           latency_bucket(duration_ms) AS bucket,
           count(*) AS calls,
           count(*) FILTER (WHERE status = 'error') AS errors,
           count(duration_ms) AS timed,
           coalesce(sum(duration_ms), 0) AS duration_sum
    FROM tool_calls
    WHERE true {scope}
    GROUP BY 1, 2, 3, 4, 5
) AS by_bucket
GROUP BY workspace_id, server_id, tool_name, hour
"""

# Latency percentiles derived from the old rollups (gateway/db/analytics.py) go with them.
_FORGET_PERCENTILES = "DELETE FROM tool_call_latency_hourly WHERE true {scope}"

_WORK_MEM = "SET LOCAL work_mem = '256MB'"


@dataclass(frozen=True, slots=True)
class Rebuilt:
    deleted: int
    inserted: int


def _count(status: str) -> int:
    """The row count of a command tag such as 'INSERT 0 42'."""
    return int(status.rsplit(" ", 1)[1])


async def rebuild(conn: Connection, workspace_id: uuid.UUID | None = None) -> Rebuilt:
    """Replace the rollups (of one workspace, or all) with ones computed from tool_calls."""
    scope = "" if workspace_id is None else "AND workspace_id = $1"
    args = () if workspace_id is None else (workspace_id,)
    async with conn.transaction():
        await conn.execute(_LOCK)
        await conn.execute(_WORK_MEM)
        deleted = await conn.execute(_DELETE.format(scope=scope), *args)
        inserted = await conn.execute(_INSERT.format(scope=scope), *args)
        await conn.execute(_FORGET_PERCENTILES.format(scope=scope), *args)
    return Rebuilt(deleted=_count(deleted), inserted=_count(inserted))
