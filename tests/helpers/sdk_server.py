"""Official MCP SDK server as a real test upstream; run as a script (see tests/upstreams.py)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import signal
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CallToolRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    JSONRPCMessage,
    ListToolsResult,
    PaginatedRequestParams,
    RequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic import BaseModel, Field


class PagedServer(MCPServer):
    """MCPServer does not paginate tools/list on its own; this one pages by a fixed size."""

    page_size: int | None = None

    async def _handle_list_tools(
        self, ctx: Any, params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        tools = await self.list_tools()
        if not self.page_size:
            return ListToolsResult(tools=tools)
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + self.page_size
        return ListToolsResult(
            tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None
        )


class MemoryEventStore(EventStore):
    """Makes the SDK send priming events with `retry:` lines and lets clients resume streams."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._events: list[tuple[str, str, JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        event_id = str(next(self._ids))
        self._events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(
        self, last_event_id: str, send_callback: EventCallback
    ) -> str | None:
        stream = next((s for e, s, _ in self._events if e == last_event_id), None)
        if stream is None:
            return None
        after = int(last_event_id)
        for event_id, stream_id, message in self._events:
            if stream_id == stream and int(event_id) > after and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream


class Name(BaseModel):
    name: str


_NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId")


class Tasks(Extension):
    """The tasks extension (io.modelcontextprotocol/tasks, SEP-2663, as its specification
    repository describes it; the SDK offers the extension points, not the extension): the
    `job` tool answers with a task handle, and tasks/get tells its status, the tool's result
    inlined once completed, the JSON-RPC error once failed; tasks/cancel cancels it."""

    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, asyncio.Task[None]] = {}

    def methods(self) -> Sequence[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskParams, self._get),
            MethodBinding("tasks/cancel", TaskParams, self._cancel),
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: Any, call_next: Any
    ) -> Any:
        if params.name != "job":
            return await call_next(ctx)
        task_id = str(uuid.uuid4())
        now = datetime.now(UTC).isoformat()
        task: dict[str, Any] = {
            "taskId": task_id,
            "status": "working",
            "createdAt": now,
            "lastUpdatedAt": now,
            "ttlMs": 60_000,
            "pollIntervalMs": 20,
        }
        self.tasks[task_id] = task

        async def run() -> None:
            try:
                result = await call_next(ctx)
            except MCPError as exc:
                task.update(status="failed", error={"code": exc.code, "message": exc.message})
            else:
                dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
                task.update(status="completed", result=dumped)
            task["lastUpdatedAt"] = datetime.now(UTC).isoformat()

        self.runs[task_id] = asyncio.ensure_future(run())
        return {"resultType": "task", **task}

    async def _get(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        task = self.tasks.get(params.task_id)
        if task is None:
            raise MCPError(code=-32602, message="Failed to retrieve task: Task not found")
        return dict(task)

    async def _cancel(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        task = self.tasks.get(params.task_id)
        if task is None:
            raise MCPError(code=-32602, message="Failed to cancel task: Task not found")
        if task["status"] == "working":
            self.runs[params.task_id].cancel()
            task["status"] = "cancelled"
        return {}


def add_interactive_tools(server: MCPServer) -> None:
    """Tools that do not answer at once: `greet` asks the user's name first (elicitation: a
    2026-07-28 client gets `input_required` and retries; an older one gets an
    elicitation/create request on the call's SSE stream), `job` becomes a task (Tasks)."""

    @server.tool()
    async def greet(ctx: Context, notify: bool = False) -> Any:
        """Ask the caller's name, then greet them; `notify` sends progress first (an SSE
        reply)."""
        if notify:
            await ctx.report_progress(0.5, 1.0, "asking")
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            answers = ctx.input_responses
            if not answers:
                ask = ElicitRequestFormParams(message="Your name?", requested_schema=_NAME_SCHEMA)
                return InputRequiredResult(input_requests={"name": ElicitRequest(params=ask)})
            answer: Any = answers["name"]
            if answer.action != "accept":
                raise ToolError(f"the caller would not say ({answer.action})")
            return f"hello {answer.content['name']}"
        elicited: Any = await ctx.elicit("Your name?", Name)
        if elicited.action != "accept":
            raise ToolError(f"the caller would not say ({elicited.action})")
        return f"hello {elicited.data.name}"

    @server.tool()
    async def job(seconds: float, fail: bool = False, broken: bool = False) -> str:
        """Work for a while (as a task): `fail` ends it with isError, `broken` with a JSON-RPC
        error (a failed task)."""
        await asyncio.sleep(seconds)
        if broken:
            raise MCPError(code=-32603, message="the job's backend is gone")
        if fail:
            raise ToolError("the job did not work out")
        return f"done after {seconds} s"


def add_tracing(server: MCPServer, endpoint: str) -> TracerProvider:
    """Export this process's spans to the OTLP/HTTP collector at `endpoint`, and add the
    `trace_headers` tool.

    The SDK's OpenTelemetryMiddleware (on by default in every MCPServer) makes a SERVER span
    per inbound message, parented by `params._meta.traceparent` (never the HTTP header), on
    the global tracer provider: setting that provider is all it takes.
    """
    provider = TracerProvider(resource=Resource.create({"service.name": "sdk-test-upstream"}))
    # A 2 s export timeout: a collector already stopped cannot hold this process's exit.
    exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", timeout=2)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=50))
    trace.set_tracer_provider(provider)

    @server.tool()
    def trace_headers(ctx: Context) -> str:
        """The traceparent and tracestate HTTP headers of the request carrying this call."""
        headers = ctx.headers or {}
        found = {name: headers.get(name) for name in ("traceparent", "tracestate")}
        return json.dumps(found)

    return provider


def build_server(page_size: int | None, interactive: bool = False) -> PagedServer:
    extensions = [Tasks()] if interactive else None
    server = PagedServer("sdk-test-upstream", log_level="WARNING", extensions=extensions)
    server.page_size = page_size
    if interactive:
        add_interactive_tools(server)

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    def fail() -> str:
        """Always raises."""
        raise ValueError("this tool always fails")

    @server.tool()
    async def slow(seconds: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    def region_of(
        region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
    ) -> str:
        """Its argument is mirrored into an Mcp-Param-Region header on 2026-07-28."""
        return f"region {region}"

    @server.tool()
    async def polled(seconds: float, ctx: Context) -> str:
        """Ends its SSE stream early (2025-11-25 polling), so the client must resume with a GET."""
        await ctx.close_sse_stream()
        await asyncio.sleep(seconds)
        return "polled result"

    @server.tool()
    def register_tool(name: str) -> str:
        """Add a tool at run time, so tests can watch the tool list change."""

        def extra() -> str:
            return name

        server.add_tool(extra, name=name, description=f"added at run time: {name}")
        return f"registered {name}"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument(
        "--transport", choices=["streamable-http", "sse"], default="streamable-http"
    )
    parser.add_argument("--stateless", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--priming", action="store_true", help="send priming events with retry lines"
    )
    parser.add_argument("--page-size", type=int, default=None)
    parser.add_argument(
        "--interactive", action="store_true", help="add the greet and job tools, and tasks"
    )
    parser.add_argument(
        "--otlp-endpoint",
        help="export spans to this OTLP/HTTP collector, and add the trace_headers tool",
    )
    args = parser.parse_args()

    # Plain logging, set before the SDK's: its Rich handler renders the traceback of every
    # failing tool (the `fail` tool) for over half a second of CPU, seconds under load.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    server = build_server(args.page_size, args.interactive)
    if args.otlp_endpoint:
        provider = add_tracing(server, args.otlp_endpoint)
        # Tests stop this process with SIGTERM. Uvicorn catches it, shuts down, then raises
        # it again under the handler it found: this one, so the batch still buffered is
        # exported (the `finally` below) rather than lost.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
        try:
            serve(server, args)
        finally:
            provider.shutdown()
    else:
        serve(server, args)


def serve(server: MCPServer, args: argparse.Namespace) -> None:
    if args.transport == "sse":
        server.run("sse", host="127.0.0.1", port=args.port)
        return
    extra: dict[str, Any] = {}
    if args.priming:
        extra = {"event_store": MemoryEventStore(), "retry_interval": 200}
    server.run(
        "streamable-http",
        host="127.0.0.1",
        port=args.port,
        streamable_http_path="/mcp",
        stateless_http=args.stateless,
        json_response=args.json,
        **extra,
    )


if __name__ == "__main__":
    main()
