"""Peers for calls that do not answer at once (2026-07-28): the SDK client's side of the tasks
extension (polling tasks/get until the task ends), 2026-07-28 requests sent by hand, and what
the SDK client sent and got back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2
import orjson
from mcp.client import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict, Field

from gateway.calllog.writer import CALL_LOG
from gateway.proxy.handler import PROXYING
from gateway.proxy.tasks import TASK_FOLLOWER
from tests.helpers.api import Api
from tests.helpers.proxying import ACCEPT, Setup
from tests.helpers.toolsets import Arranged

TASKS = "io.modelcontextprotocol/tasks"
MODERN = "2026-07-28"
# The _meta a 2026-07-28 client sends with every request (here: one that speaks tasks).
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "by-hand", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
}


# -- the SDK client's side of the tasks extension -----------------------------------------------


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"  # SEP-2663: Mcp-Name carries the task id


class TaskHandle(Result):
    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = Field("task", alias="resultType")
    task_id: str = Field(alias="taskId")
    poll_interval_ms: int | None = Field(None, alias="pollIntervalMs")


class TaskState(Result):
    model_config = ConfigDict(extra="allow")
    status: str
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskFailed(Exception):
    """The task ended without a result (failed, or cancelled)."""

    def __init__(self, state: TaskState) -> None:
        super().__init__(f"task {state.status}: {state.error}")
        self.state = state


async def _until_ended(handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
    while True:
        request = GetTask(params=TaskParams(taskId=handle.task_id))
        state = await ctx.session.send_request(request, TaskState)
        if state.status == "completed" and state.result is not None:
            return CallToolResult.model_validate(state.result)
        if state.status in ("failed", "cancelled"):
            raise TaskFailed(state)
        await asyncio.sleep((handle.poll_interval_ms or 20) / 1000)


class PollingTasks(ClientExtension):
    """A `tools/call` answered with a task handle is polled with tasks/get until it ends."""

    identifier = TASKS

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=_until_ended)]


# -- what the SDK client exchanged ---------------------------------------------------------------


@dataclass
class Wire:
    """The MCP method and the reply's Content-Type of each request an SDK client sent."""

    exchanges: list[tuple[str | None, str | None]] = field(default_factory=list)

    async def _seen(self, response: httpx2.Response) -> None:
        method = response.request.headers.get("Mcp-Method")
        if method is None and response.request.method == "POST":
            try:
                method = orjson.loads(response.request.content).get("method")
            except (orjson.JSONDecodeError, AttributeError):
                method = None
        self.exchanges.append((method, response.headers.get("Content-Type")))

    def replies_to(self, method: str) -> list[str]:
        """The media type of each reply to `method` ("" for a reply without one)."""
        return [(kind or "").split(";")[0] for sent, kind in self.exchanges if sent == method]


def watched_client(setup: Setup | Arranged, mode: str, wire: Wire, **options: Any) -> Client:
    """The SDK client through the gateway (a server's proxy URL, or a toolset's), each
    exchange noted in `wire`."""
    http = httpx2.AsyncClient(
        headers={"X-API-Key": setup.key}, timeout=30, event_hooks={"response": [wire._seen]}
    )
    return Client(streamable_http_client(setup.url, http_client=http), mode=mode, **options)


# -- 2026-07-28 by hand --------------------------------------------------------------------------


def modern(method: str, params: dict[str, Any], rid: int = 1) -> dict[str, Any]:
    """A 2026-07-28 request: its _meta says the version, and that the client speaks tasks."""
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": method,
        "params": {**params, "_meta": MODERN_META},
    }


def modern_headers(method: str, name: str | None = None) -> dict[str, str]:
    headers = {
        "Accept": ACCEPT,
        "Content-Type": "application/json",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


async def send(setup: Setup, message: dict[str, Any], key: str | None = None) -> Any:
    """POST a 2026-07-28 message through `setup`'s gateway; its JSON-RPC response (from JSON,
    or the SSE event that carries it)."""
    params = message["params"]
    name = params.get("name") if message["method"] == "tools/call" else params.get("taskId")
    response = await setup.api.client.post(
        f"/api/v1{setup.path}",
        data=orjson.dumps(message),
        headers={"X-API-Key": key or setup.key, **modern_headers(message["method"], name)},
    )
    body = await response.read()
    assert response.status == 200, (response.status, body)
    if response.headers["Content-Type"].startswith("text/event-stream"):
        for line in body.decode().splitlines():
            if line.startswith("data:") and line[5:].strip():
                data = orjson.loads(line[5:])
                if data.get("id") == message["id"]:
                    return data
        raise AssertionError(f"no response in {body!r}")
    return orjson.loads(body)


async def settled(api: Api, within: float = 10.0) -> None:
    """Wait until every proxied request has ended, every job about tasks too, and every row
    they queued is written: then the call log holds all it will of what was sent."""
    proxying = api.app[PROXYING]
    follower = api.app[TASK_FOLLOWER]
    call_log = api.app[CALL_LOG]
    deadline = time.monotonic() + within
    while proxying.in_flight.count or follower.busy or len(call_log):
        assert time.monotonic() < deadline, "the gateway did not settle"
        await asyncio.sleep(0.01)
