"""/healthz and /readyz, for load balancers and orchestrators: outside /api/v1, without
credentials or rate limits, and cheap enough to be polled every second.

/healthz says the process is alive (its event loop answers) and which worker it is; it never
touches the database,
so a database outage does not get healthy processes restarted. /readyz says this process can
take traffic now: PostgreSQL answers within a bound, the schema is the one this code expects,
and the call log is not nearly full (a process about to drop tool calls should get no more).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiohttp import web

from gateway.calllog.writer import CALL_LOG
from gateway.db.schema import current_version, migrations, schema_sql
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.keys import POOL, SETTINGS

# How long the database may take to answer a readiness check.
DATABASE_BOUND_SECONDS = 2.0
# Above this share of its bound the call log is about to drop calls: not ready.
CALL_LOG_READY_SHARE = 0.9


def expected_schema_version() -> int:
    """The version this code needs: the one schema.sql creates (the newest migration's)."""
    created = re.search(r"INSERT INTO schema_version \(version\) VALUES \((\d+)\)", schema_sql())
    assert created is not None, "schema.sql records its version"
    return max(int(created.group(1)), *(number for number, _ in migrations()))


EXPECTED_SCHEMA_VERSION = expected_schema_version()


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.json_response(body, status=status, headers={"Cache-Control": "no-store"})


async def healthz(request: web.Request) -> web.Response:
    # Which process answered (0 alone, 1..N under serve --workers): to see a balancer spread.
    return _json(200, {"status": "alive", "worker": request.app[SETTINGS].worker_id})


class DatabaseCheck:
    """One check of PostgreSQL at a time, answered within DATABASE_BOUND_SECONDS.

    A check that overruns is left to finish in the background (its connection goes back to
    the pool when the database answers or the pool's own bounds give up) and is joined by the
    next poll, so a hung database never piles up checks or holds a poll past the bound.
    """

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._running: asyncio.Task[int | None] | None = None

    async def version(self) -> int | None:
        """The schema version; TimeoutError if the database does not answer in time."""
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._read_version())
            # Its failure is reported by whichever poll awaits it, if one still does.
            self._running.add_done_callback(lambda task: task.cancelled() or task.exception())
        done, _ = await asyncio.wait({self._running}, timeout=DATABASE_BOUND_SECONDS)
        if not done:
            raise TimeoutError
        return self._running.result()

    async def _read_version(self) -> int | None:
        async with self._app[POOL].acquire() as conn:
            return await current_version(conn)


async def readyz(request: web.Request) -> web.Response:
    problems = []
    try:
        version = await request.app[DATABASE_CHECK].version()
    except TimeoutError:
        problems.append(f"database: no answer within {DATABASE_BOUND_SECONDS:g} s")
    except DATABASE_ERRORS as exc:
        problems.append(f"database: unreachable ({type(exc).__name__})")
    else:
        if version != EXPECTED_SCHEMA_VERSION:
            problems.append(
                f"schema: version {version}, this gateway needs {EXPECTED_SCHEMA_VERSION}"
            )
    call_log = request.app[CALL_LOG]
    pending, bound = len(call_log), call_log.max_rows
    if pending >= CALL_LOG_READY_SHARE * bound:
        problems.append(f"call log: {pending} of at most {bound} tool calls waiting to be stored")
    if problems:
        return _json(503, {"detail": "not ready: " + "; ".join(problems)})
    return _json(200, {"status": "ready"})


def _described(name: str, summary: str, ok: dict[str, Any], failure: int | None) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {"description": "OK", "content": {"application/json": {"schema": ok}}}
    }
    if failure is not None:
        error = {"$ref": "#/components/schemas/Error"}
        responses[str(failure)] = {
            "description": "Service Unavailable: what is not ready",
            "content": {"application/json": {"schema": error}},
        }
    get = {"tags": ["health"], "summary": summary, "operationId": f"get_{name}"}
    return {"get": {**get, "security": [], "responses": responses}}


def _status(value: str, **more: Any) -> dict[str, Any]:
    properties = {"status": {"const": value}, **more}
    return {"type": "object", "required": list(properties), "properties": properties}


# For the OpenAPI document (gateway/api/openapi.py): these routes live outside /api/v1.
OPENAPI_PATHS = {
    "/healthz": _described(
        "healthz",
        "Liveness: the process answers (never touches the database)",
        _status("alive", worker={"type": "integer", "minimum": 0}),
        None,
    ),
    "/readyz": _described(
        "readyz",
        "Readiness: PostgreSQL answers within 2 s, the schema is current, the call log has room",
        _status("ready"),
        503,
    ),
}


def setup_readiness(app: web.Application) -> None:
    app[DATABASE_CHECK] = DatabaseCheck(app)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


# /readyz's check of PostgreSQL (one at a time, however often it is polled).
DATABASE_CHECK: web.AppKey[DatabaseCheck] = web.AppKey("database_check")
