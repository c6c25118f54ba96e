"""Hostile upstreams on loopback: gigantic tool lists (streamed, paged, or too many tools), and
JSON Schemas built to cost a validator seconds to hours."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.helpers.upstreams import serve_loopback

MiB = 1024 * 1024
_CHUNK = 64 * 1024


# -- schemas --------------------------------------------------------------------------------


def catastrophic_pattern() -> dict[str, Any]:
    """A backtracking regex engine takes 2**n steps to reject n "a"s and a "!"."""
    return {
        "type": "object",
        "properties": {"text": {"type": "string", "pattern": "^(a+)+$"}},
        "required": ["text"],
    }


def any_of_chain(levels: int = 40) -> dict[str, Any]:
    """About 3 KB: each level offers two branches into the next, so rejecting a value takes
    2**levels steps."""
    defs: dict[str, Any] = {f"d{levels}": {"type": "integer"}}
    for i in range(levels):
        nxt = {"$ref": f"#/$defs/d{i + 1}"}
        defs[f"d{i}"] = {"anyOf": [nxt, {**nxt, "minimum": 1}]}
    return {"$defs": defs, "type": "object", "properties": {"value": {"$ref": "#/$defs/d0"}}}


def unique_objects() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"items": {"type": "array", "uniqueItems": True}},
    }


def ref_loop() -> dict[str, Any]:
    return {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "type": "object",
        "properties": {"value": {"$ref": "#/$defs/a"}},
    }


def distinct_objects(count: int) -> list[dict[str, Any]]:
    """Objects that differ only deep down, the costliest case for `uniqueItems`."""
    return [{"k": i, "nested": [i, {"deeper": i}]} for i in range(count)]


def schema_tool(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "description": f"hostile tool {name}", "inputSchema": schema}


# -- tool lists -----------------------------------------------------------------------------


def filler_tool(index: int, size: int) -> bytes:
    """One tool of about `size` bytes of JSON."""
    head = orjson.dumps({"name": f"tool_{index}", "inputSchema": {"type": "object"}})
    pad = max(0, size - len(head) - 20)
    return head[:-1] + b',"description":"' + b"x" * pad + b'"}'


def empty_objects_tool(index: int, raw_bytes: int) -> bytes:
    """One tool of about `raw_bytes` whose schema holds nothing but empty objects: the JSON
    that takes the most memory once parsed, about 25 times its size."""
    count = max(1, raw_bytes // 3)
    body = b",".join([b"{}"] * count)
    return b'{"name":"tool_%d","inputSchema":{"type":"object","examples":[%s]}}' % (index, body)


@dataclass
class HostileLister:
    """A handshake-era MCP upstream whose tools/list replies are streamed from a generator of
    chunks, so a reply may be far larger than anything it holds; it records how much of each
    reply it got to send before the client hung up.

    `page(index)` returns (tools as raw JSON fragments, whether another page follows); the
    default is `page_bytes` of 1 KiB tools, `pages` times, then the end.
    """

    page_bytes: int = 100 * MiB
    pages: int = 1
    tool_bytes: int = 1024
    tool_count: int | None = None  # instead of page_bytes: this many tiny tools per page
    empty_objects: int | None = None  # instead: one tool of this many bytes of `{}`s
    sse: bool = False
    announce_length: bool = False
    url: str = ""
    sent: list[int] = field(default_factory=list)  # bytes sent of each tools/list reply
    hung_up: int = 0  # tools/list replies the client stopped reading
    lists: int = 0
    sessions: set[str] = field(default_factory=set)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "DELETE":
            return web.Response(status=200)
        if request.method != "POST":
            return web.Response(status=405)
        body = orjson.loads(await request.read())
        method, rid = body.get("method"), body.get("id")
        if method == "initialize":
            session = uuid.uuid4().hex
            self.sessions.add(session)
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
            return web.json_response(
                {"jsonrpc": "2.0", "id": rid, "result": result},
                headers={"Mcp-Session-Id": session},
            )
        if request.headers.get("Mcp-Session-Id") not in self.sessions:
            # Refuses server/discover the way pre-2026 servers do: the client handshakes.
            error = {"code": -32600, "message": "Bad Request: Missing session ID"}
            return web.json_response({"jsonrpc": "2.0", "id": None, "error": error}, status=400)
        if rid is None:
            return web.Response(status=202)
        if method != "tools/list":
            error = {"code": -32601, "message": "Method not found"}
            return web.json_response({"jsonrpc": "2.0", "id": rid, "error": error})
        cursor = (body.get("params") or {}).get("cursor")
        return await self._list(request, rid, int(cursor) if cursor else 0)

    def reply_size(self, index: int = 0, rid: Any = 1) -> int:
        return sum(len(part) for part in self._reply(rid, index))

    def _tools(self, index: int) -> Iterator[bytes]:
        if self.empty_objects is not None:
            yield empty_objects_tool(index, self.empty_objects)
        elif self.tool_count is not None:
            yield from (b'{"name":"t%d_%d"}' % (index, i) for i in range(self.tool_count))
        else:
            count = max(1, self.page_bytes // self.tool_bytes)
            yield from (filler_tool(index * count + i, self.tool_bytes) for i in range(count))

    def _reply(self, rid: Any, index: int) -> Iterator[bytes]:
        """The reply's JSON in parts, made as they are sent (a reply may be 100 MB)."""
        yield b'{"jsonrpc":"2.0","id":%s,"result":{"tools":[' % orjson.dumps(rid)
        for i, tool in enumerate(self._tools(index)):
            yield tool if i == 0 else b"," + tool
        yield b'],"nextCursor":"%d"}}' % (index + 1) if index + 1 < self.pages else b"]}}"

    async def _list(self, request: web.Request, rid: Any, index: int) -> web.StreamResponse:
        self.lists += 1
        headers = {"Content-Type": "text/event-stream" if self.sse else "application/json"}
        if self.announce_length and not self.sse:
            headers["Content-Length"] = str(self.reply_size(index, rid))
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        sent = 0
        self.sent.append(0)
        slot = len(self.sent) - 1
        try:
            if self.sse:
                await resp.write(b"event: message\ndata: ")
            buffer = bytearray()
            for part in self._reply(rid, index):
                buffer += part
                if len(buffer) >= _CHUNK:
                    await resp.write(bytes(buffer))
                    sent += len(buffer)
                    self.sent[slot] = sent
                    buffer.clear()
            if self.sse:
                buffer += b"\n\n"
            await resp.write(bytes(buffer))
            sent += len(buffer)
            self.sent[slot] = sent
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):  # the client hung up
            self.hung_up += 1
            raise
        return resp


@contextlib.asynccontextmanager
async def hostile_lister(**behaviour: Any) -> AsyncIterator[HostileLister]:
    lister = HostileLister(**behaviour)
    app = web.Application()
    app.router.add_route("*", "/mcp", lister.handle)
    async with serve_loopback(app) as base_url:
        lister.url = f"{base_url}/mcp"
        yield lister
