"""Tool integrity: every tool list the gateway sees (probes, playground fetches, proxied
`tools/list` replies) fingerprinted per tool, and what changed since the last list stored.

A tool's *definition* is what a model reads and a call must match: name, title, description,
inputSchema, outputSchema and annotations. Its *fingerprint* is the SHA-256 of the definition's
canonical JSON (keys sorted, compact). A list is first compared whole, by one hash over its
sorted definitions, against the one last stored for the server: the common case, the same
list again, costs that hash and one indexed read. Only a list that differs is diffed tool by
tool (gateway/db/server_tools).

Proxied replies are read off the bytes already relayed, in background tasks of which a
bounded number run at once (more are dropped: the next list, or the next probe, sees the
same change), so a reply is never delayed by its fingerprint.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Final

import asyncpg
import orjson
from aiohttp import web

from gateway.db import server_tools as server_tools_db
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.keys import POOL

log = logging.getLogger(__name__)

FIELDS: Final = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
# Lists waiting to be fingerprinted in the background, in this process; past it they are
# dropped (a list seen later, or the next probe, records the same change).
MAX_PENDING: Final = 32
# An SSE event ends at a blank line (any of the three line ends; CR LF is one, not two).
_LINE_END = rb"(?:\r\n|\r(?!\n)|\n)"
_EVENT_END = re.compile(_LINE_END + _LINE_END)


def definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a listed tool its fingerprint covers."""
    return {field: tool[field] for field in FIELDS if field in tool}


def fingerprint(tool_definition: Mapping[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(tool_definition, option=orjson.OPT_SORT_KEYS)).hexdigest()


def definitions(tools: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """name -> definition of each named tool, in name order; of tools listed twice under one
    name, the first (as a client finding a tool by name would)."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            found.setdefault(tool["name"], definition(tool))
    return dict(sorted(found.items()))


def list_digest(defined: Mapping[str, Mapping[str, Any]]) -> str:
    """One hash of a whole list (from definitions()): equal lists, equal digests."""
    return hashlib.sha256(
        orjson.dumps(list(defined.values()), option=orjson.OPT_SORT_KEYS)
    ).hexdigest()


def listed_tools(body: bytes, event_stream: bool, ids: list[Any], sent: bytes) -> list[Any] | None:
    """The tools of a complete `tools/list` response (to one of `ids`, requests of the body
    `sent`) in a relayed reply, or None: no such response, or only a page of a longer list (it
    has a `nextCursor`, or its request a `cursor`), which says nothing of the other pages."""
    try:
        request = orjson.loads(sent)
    except orjson.JSONDecodeError:
        return None
    firsts = [
        one.get("id")
        for one in (request if type(request) is list else [request])
        if type(one) is dict
        and one.get("id") in ids
        and not (type(one.get("params")) is dict and one["params"].get("cursor"))
    ]
    if not firsts:
        return None
    messages: list[Any] = []
    if event_stream:
        for event in _EVENT_END.split(body):
            data = [
                line[5:].removeprefix(b" ")
                for line in event.splitlines()
                if line.startswith(b"data:")
            ]
            if data:
                try:
                    messages.append(orjson.loads(b"\n".join(data)))
                except orjson.JSONDecodeError:
                    continue
    else:
        try:
            messages.append(orjson.loads(body))
        except orjson.JSONDecodeError:
            return None
    for message in messages:
        for one in message if type(message) is list else [message]:
            if type(one) is not dict or one.get("id") not in firsts:
                continue
            result = one.get("result")
            if type(result) is not dict or type(result.get("tools")) is not list:
                continue
            if result.get("nextCursor"):
                return None
            tools: list[Any] = result["tools"]
            return tools
    return None


class ToolWatch:
    """Records the tool lists this process sees: at once (seen), or later in a bounded
    background task (seen_later)."""

    def __init__(self, pool: asyncpg.Pool, *, max_pending: int = MAX_PENDING) -> None:
        self._pool = pool
        self._max_pending = max_pending
        self._tasks: set[asyncio.Task[None]] = set()
        # Lists dropped because too many were waiting (for tests and the curious).
        self.dropped = 0

    async def seen(self, server_id: uuid.UUID, tools: Iterable[Any]) -> int:
        """Store what changed in the server's tools since the last list; returns how many
        changes were recorded (0 for the same list, and for the first list of a server,
        which is where its history starts)."""
        defined = definitions(tools)
        digest = list_digest(defined)
        if await server_tools_db.current_digest(self._pool, server_id) == digest:
            return 0
        fingerprints = {name: fingerprint(one) for name, one in defined.items()}
        return await server_tools_db.record(self._pool, server_id, defined, fingerprints, digest)

    def seen_later(self, server_id: uuid.UUID, read: Callable[[], Iterable[Any] | None]) -> None:
        """Fingerprint the list `read` gives (None: none to record) in the background."""
        if len(self._tasks) >= self._max_pending:
            self.dropped += 1
            log.debug("tool list of server %s not fingerprinted: too many waiting", server_id)
            return
        task = asyncio.create_task(self._record_later(server_id, read))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the lists being recorded (tests; shutdown)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _record_later(
        self, server_id: uuid.UUID, read: Callable[[], Iterable[Any] | None]
    ) -> None:
        try:
            tools = read()
            if tools is not None:
                await self.seen(server_id, tools)
        except DATABASE_ERRORS as exc:
            log.warning("could not store the tool list of server %s: %s", server_id, exc)
        except Exception:
            log.exception("fingerprinting the tool list of server %s failed", server_id)


async def tool_watch_context(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: after the pool (lists still being recorded finish before it closes)."""
    watch = ToolWatch(app[POOL])
    app[TOOL_WATCH] = watch
    yield
    await watch.drain()


# The process's recorder of tool lists.
TOOL_WATCH: web.AppKey[ToolWatch] = web.AppKey("tool_watch")
