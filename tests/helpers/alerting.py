"""Helpers for the alert tests: a real loopback webhook receiver, and arranging data and rounds."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from aiohttp import web

from gateway.background.alert_evaluator import evaluate_due_rules
from gateway.background.notifier import DeliveryPolicy, deliver_due
from gateway.db import alert_evaluation as evaluation_db
from gateway.keys import HTTP, POOL, SETTINGS
from gateway.ops.metrics import METRICS
from tests.helpers.api import Account, Api, Credential
from tests.helpers.upstreams import serve_loopback, unused_url

# Fast retries for tests; production waits 15 s after the first failure.
FAST = DeliveryPolicy(timeout_seconds=2.0, max_attempts=3, backoff_seconds=0.05)


@dataclass(frozen=True, slots=True)
class Received:
    path: str
    body: Any
    headers: dict[str, str]
    at: float


@dataclass
class Receiver:
    """An HTTP server on 127.0.0.1 that records every request. `script[path]` lists the
    statuses of the next answers on that path (then 200); `delay` holds each answer."""

    base_url: str = ""
    received: list[Received] = field(default_factory=list)
    script: dict[str, list[int]] = field(default_factory=dict)
    delay: float = 0.0
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def on(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.received.append(
            Received(request.path, orjson.loads(raw), dict(request.headers), time.monotonic())
        )
        async with self._arrived:
            self._arrived.notify_all()
        if self.delay:
            await asyncio.sleep(self.delay)
        statuses = self.script.get(request.path)
        status = statuses.pop(0) if statuses else 200
        return web.Response(status=status, text="ok" if status < 300 else "receiver says no")

    async def wait_for(self, path: str, count: int, within: float = 10.0) -> list[Received]:
        async with asyncio.timeout(within), self._arrived:
            await self._arrived.wait_for(lambda: len(self.on(path)) >= count)
        return self.on(path)


@contextlib.asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:
    recv = Receiver()
    app = web.Application()
    app.router.add_route("POST", "/{name}", recv.handle)
    async with serve_loopback(app) as base_url:
        recv.base_url = base_url
        yield recv


# -- arranging ---------------------------------------------------------------------------------


def ago(**delta: float) -> str:
    return (datetime.now(UTC) - timedelta(**delta)).isoformat()


async def add_server(api: Api, admin: Account, name: str, url: str | None = None) -> str:
    reply = await api.post(
        "/servers", json={"name": name, "url": url or unused_url()}, auth=admin, expect=201
    )
    server_id: str = reply.body["id"]
    return server_id


async def ingest(api: Api, auth: Credential, server_id: str, calls: list[dict[str, Any]]) -> None:
    """Store tool calls through POST /tool-calls (which also writes the hourly rollups)."""
    body = [{"server_id": server_id, "tool_name": "t", "status": "success", **c} for c in calls]
    await api.post("/tool-calls", json=body, auth=auth, expect=201)


async def add_rule(api: Api, admin: Account, **fields: Any) -> dict[str, Any]:
    body = {"name": "rule", "operator": ">", "threshold": 0, "window_minutes": 5, **fields}
    reply = await api.post("/alerts/rules", json=body, auth=admin, expect=201)
    rule: dict[str, Any] = reply.body
    return rule


async def evaluate(api: Api) -> int:
    """One evaluation round in which every enabled rule is due (as if an interval had passed)."""
    pool = api.app[POOL]
    await pool.execute("UPDATE alert_rules SET next_eval_at = now()")
    interval = api.app[SETTINGS].alert_eval_interval_seconds
    return await evaluate_due_rules(pool, interval, metrics=api.app[METRICS])


async def deliver(api: Api, policy: DeliveryPolicy = FAST) -> int:
    return await deliver_due(api.app[POOL], api.app[HTTP], policy, api.app[METRICS])


async def events(api: Api, auth: Credential, **params: Any) -> list[dict[str, Any]]:
    reply = await api.get("/alerts/events", auth=auth, params=params, expect=200)
    items: list[dict[str, Any]] = reply.body["items"]
    return items


async def claim_all(api: Api) -> list[evaluation_db.DueRule]:
    pool = api.app[POOL]
    await pool.execute("UPDATE alert_rules SET next_eval_at = now()")
    return await evaluation_db.claim_due_rules(pool, 60.0, 1000)
