"""Official MCP SDK server as a real test upstream; run as a script (see tests/upstreams.py)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp_types import JSONRPCMessage, ListToolsResult, PaginatedRequestParams
from pydantic import Field


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


def build_server(page_size: int | None) -> PagedServer:
    server = PagedServer("sdk-test-upstream", log_level="WARNING")
    server.page_size = page_size

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
    args = parser.parse_args()

    # Plain logging, set before the SDK's: its Rich handler renders the traceback of every
    # failing tool (the `fail` tool) for over half a second of CPU, seconds under load.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    server = build_server(args.page_size)
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
