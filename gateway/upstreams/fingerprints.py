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
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping
from typing import Any, Final

import asyncpg
import orjson
from aiohttp import web

from gateway.db import server_tools as server_tools_db
from gateway.db.unavailable import DATABASE_ERRORS
from gateway.keys import POOL
from gateway.mcp.errors import ToolListTooLarge
from gateway.mcp.tool_list_budget import MiB, ToolListMemory, parsed_size

log = logging.getLogger(__name__)

FIELDS: Final = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
# Lists waiting to be fingerprinted in the background, in this process; past it they are
# dropped (a list seen later, or the next probe, records the same change).
MAX_PENDING: Final = 32
# And the copies of relayed replies they hold, together (a reply is up to 8 MiB).
MAX_PENDING_BYTES: Final = 16 * MiB
# A definition stored (for the history and its diffs) is at most this long; a longer one is
# stored as a note of its size. Its fingerprint still covers all of it, so its changes are
# still seen and pinning still holds: only the copy kept is cut. PostgreSQL parses a stored
# definition as jsonb, and a hostile one of megabytes of `{}`s costs it a CPU-second, which
# the gateway's own process then waits for (a tenant must not slow the others that way).
MAX_STORED_DEFINITION_BYTES: Final = 64 * 1024
# An SSE event ends at a blank line (any of the three line ends; CR LF is one, not two).
_LINE_END = rb"(?:\r\n|\r(?!\n)|\n)"
_EVENT_END = re.compile(_LINE_END + _LINE_END)


def definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a listed tool its fingerprint covers."""
    return {field: tool[field] for field in FIELDS if field in tool}


def canonical(tool_definition: Mapping[str, Any]) -> bytes:
    """A definition's JSON as fingerprinted and stored: keys sorted, compact."""
    return orjson.dumps(tool_definition, option=orjson.OPT_SORT_KEYS)


def fingerprint(tool_definition: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(tool_definition)).hexdigest()


def definitions(tools: Iterable[Any]) -> dict[str, bytes]:
    """name -> canonical JSON of each named tool's definition, in name order; of tools listed
    twice under one name, the first (as a client finding a tool by name would). As bytes, not
    objects: a list is kept only as long as it is read (a parsed hostile list takes many times
    its size), and PostgreSQL is given the text as it is."""
    found: dict[str, bytes] = {}
    for tool in tools:
        name = tool.get("name") if isinstance(tool, dict) else None
        if isinstance(name, str) and name not in found:
            found[name] = canonical(definition(tool))
    return dict(sorted(found.items()))


def _stored(name: str, raw: bytes) -> bytes:
    """The copy of a definition the history keeps (see MAX_STORED_DEFINITION_BYTES)."""
    if len(raw) <= MAX_STORED_DEFINITION_BYTES:
        return raw
    note = f"definition of {len(raw)} bytes, over the {MAX_STORED_DEFINITION_BYTES} kept"
    return orjson.dumps({"name": name, "omitted": note})


def list_digest(defined: Mapping[str, bytes]) -> str:
    """One hash of a whole list (from definitions()): equal lists, equal digests."""
    return hashlib.sha256(b"[" + b",".join(defined.values()) + b"]").hexdigest()


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
    background task (seen_later, relayed)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        memory: ToolListMemory | None = None,
        *,
        max_pending: int = MAX_PENDING,
        max_pending_bytes: int = MAX_PENDING_BYTES,
    ) -> None:
        self._pool = pool
        # Relayed replies are parsed within the process's memory for tool lists.
        self._memory = memory or ToolListMemory()
        self._max_pending = max_pending
        self._max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0
        self._tasks: set[asyncio.Task[None]] = set()
        # Lists dropped because too many were waiting (for tests and the curious).
        self.dropped = 0

    async def seen(self, server_id: uuid.UUID, defined: Mapping[str, bytes]) -> int:
        """Store what changed in the server's tools (from definitions()) since the last list;
        returns how many changes were recorded (0 for the same list, and for the first list
        of a server, which is where its history starts)."""
        digest = list_digest(defined)
        if await server_tools_db.current_digest(self._pool, server_id) == digest:
            return 0
        fingerprints = {name: hashlib.sha256(raw).hexdigest() for name, raw in defined.items()}
        stored = {name: _stored(name, raw) for name, raw in defined.items()}
        return await server_tools_db.record(self._pool, server_id, stored, fingerprints, digest)

    def seen_later(self, server_id: uuid.UUID, defined: Mapping[str, bytes]) -> None:
        """seen(), in the background."""
        if len(self._tasks) >= self._max_pending:
            self.dropped += 1
            return
        self._start(server_id, self._record(server_id, defined))

    def relayed(
        self,
        server_id: uuid.UUID,
        workspace_id: uuid.UUID,
        body: bytes,
        event_stream: bool,
        ids: list[Any],
        sent: bytes,
    ) -> None:
        """A relayed `tools/list` reply (see listed_tools), parsed and recorded in the
        background within the process's memory for tool lists (for `workspace_id`); replies
        past the bounds of what may wait are dropped."""
        if (
            len(self._tasks) >= self._max_pending
            or self._pending_bytes + len(body) > self._max_pending_bytes
        ):
            self.dropped += 1
            log.debug("tool list of server %s not fingerprinted: too many waiting", server_id)
            return
        self._pending_bytes += len(body)
        work = self._read_relayed(server_id, workspace_id, body, event_stream, ids, sent)
        self._start(server_id, work)

    async def drain(self) -> None:
        """Wait for the lists being recorded (tests; shutdown)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _start(self, server_id: uuid.UUID, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_relayed(
        self,
        server_id: uuid.UUID,
        workspace_id: uuid.UUID,
        body: bytes,
        event_stream: bool,
        ids: list[Any],
        sent: bytes,
    ) -> None:
        hold = self._memory.hold(workspace_id)
        try:
            try:
                await hold.grow(len(body) + parsed_size(body))
            except ToolListTooLarge:
                return
            tools = listed_tools(body, event_stream, ids, sent)
            defined = None if tools is None else definitions(tools)
            del tools
        finally:
            hold.release()
            self._pending_bytes -= len(body)
            del body
        if defined is not None:
            await self._record(server_id, defined)

    async def _record(self, server_id: uuid.UUID, defined: Mapping[str, bytes]) -> None:
        try:
            await self.seen(server_id, defined)
        except DATABASE_ERRORS as exc:
            log.warning("could not store the tool list of server %s: %s", server_id, exc)
        except Exception:
            log.exception("fingerprinting the tool list of server %s failed", server_id)


async def tool_watch_context(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: after the pool (lists still being recorded finish before it closes)."""
    # (Declared with the playground's lists, which record theirs here.)
    from gateway.upstreams.tool_lists import TOOL_LIST_MEMORY

    watch = ToolWatch(app[POOL], app[TOOL_LIST_MEMORY])
    app[TOOL_WATCH] = watch
    yield
    await watch.drain()


# The process's recorder of tool lists.
TOOL_WATCH: web.AppKey[ToolWatch] = web.AppKey("tool_watch")
