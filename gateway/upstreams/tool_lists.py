"""The playground's upstream tool lists: cached per server, fetched once at a time per process.

Entries live in the shared response cache (gateway/shared_cache.py). Each carries a fingerprint
of the server's url and credentials, so a list is never served for a server that has changed
since it was fetched, whatever the backend and whether or not a NOTIFY was heard; deleted
servers are not found at all. A DELETE of the cache drops the entry and broadcasts
`tool_list:<server id>:<origin>` on the invalidation channel, so every other process forgets its
own copy (in memory) and does not store a fetch that was under way. The origin names the process
that dropped: it has forgotten already, and hearing its own drop later (PostgreSQL delivers it
after a delay, a long one under load) must not void the fetch that followed the drop.

Lists are read within the process's ToolListMemory, on behalf of the server's workspace (so a
list over the MCP client's bounds is a 502), and a list stays in that memory as long as its
ToolList lives. Entries keep the tools as JSON text, so a cached list too is parsed only once
its memory is granted; requests for the same list at the same time share one read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import uuid
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import asyncpg
import orjson
from aiocache.base import BaseCache
from aiohttp import web
from redis.exceptions import RedisError

from gateway.caching.caches import CACHES, Caches
from gateway.caching.listener import CHANNEL
from gateway.caching.shared import SHARED_CACHE, is_shared
from gateway.errors import BadGateway, GatewayTimeout, ServiceUnavailable
from gateway.keys import HTTP, POOL, SETTINGS
from gateway.mcp.client import McpClient
from gateway.mcp.errors import McpError, McpTimeoutError, ToolListTooLarge
from gateway.mcp.tool_list_budget import ToolListHold, ToolListMemory, parsed_size
from gateway.upstreams.fingerprints import TOOL_WATCH, ToolWatch, definitions
from gateway.upstreams.servers import Upstream

log = logging.getLogger(__name__)

# The NOTIFY "table" of a dropped tool list (payload `tool_list:<server id>`).
TABLE = "tool_list"
# Cache keys: `tool_list_json:<server id>` (in memory with a stamp after it). Entries hold the
# tools as JSON text; older gateways keep them parsed under `tool_list:`, so during an upgrade
# neither reads the other's entries.
ENTRY = "tool_list_json"
_CACHE_ERRORS = (OSError, TimeoutError, RedisError)


# weakref_slot: the list's memory is given back when the last request using it lets it go.
@dataclass(frozen=True, slots=True, weakref_slot=True)
class ToolList:
    # The tools in the upstream's order: name, description, inputSchema (never missing), and
    # title, outputSchema, annotations where the server gave them.
    tools: list[dict[str, Any]]
    fetched_at: datetime
    cached: bool

    def find(self, name: str) -> dict[str, Any] | None:
        return next((tool for tool in self.tools if tool["name"] == name), None)


@contextlib.asynccontextmanager
async def mcp_session(
    http: aiohttp.ClientSession,
    upstream: Upstream,
    timeout: float,  # noqa: ASYNC109 -- bounds the whole session, connect included
    memory: ToolListMemory | None = None,
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[McpClient]:
    """A connected client whose whole use (connect + block) must end within `timeout`;
    the upstream session is ended afterwards, outside that bound. Tool lists it reads are held
    in `memory` for the server's workspace. `headers` go with every request besides the
    server's credentials (a trace context)."""
    client = McpClient(
        http,
        upstream.url,
        upstream.auth_headers if headers is None else {**upstream.auth_headers, **headers},
        timeout,
        memory=memory,
        owner=upstream.workspace_id,
    )
    try:
        try:
            async with asyncio.timeout(timeout):
                await client.connect()
                yield client
        except TimeoutError:
            raise McpTimeoutError(f"timed out after {timeout:g} s") from None
    finally:
        await client.close()


class ToolLists:
    """server -> its tool list, cached for `ttl` seconds, with one upstream fetch in flight per
    (server, url + credentials) in this process however many requests wait for it."""

    def __init__(
        self,
        cache: BaseCache,
        http: aiohttp.ClientSession,
        pool: asyncpg.Pool,
        caches: Caches,
        memory: ToolListMemory,
        *,
        ttl: float,
        timeout: float,
        secret: str,
        watch: ToolWatch | None = None,
    ) -> None:
        self._cache = cache
        # Where fetched lists are fingerprinted (tool integrity).
        self._watch = watch
        self._http = http
        self._pool = pool
        self.memory = memory
        self._ttl = ttl
        self._timeout = timeout
        # Keys the fingerprints, so Redis never holds a guessable digest of credentials.
        self._secret = hashlib.sha256(b"mcp-gateway tool list:" + secret.encode()).digest()
        # Redis entries are shared: a DELETE removes them for everyone (its NOTIFY then only
        # stops fetches under way elsewhere from storing). Entries in memory are this
        # process's own: only NOTIFY keeps them fresh.
        self._shared = is_shared(cache)
        # Set by Caches.set_listening: off while no NOTIFY can be heard (memory backend only).
        self.enabled = False
        # Memory keys carry (clears, epoch of the server): bumping them is an instant, sync
        # drop from a NOTIFY callback. Any bump also stops an in-flight fetch from storing.
        self._clears = 0
        self._epochs: dict[uuid.UUID, int] = {}
        self._fetches: dict[tuple[uuid.UUID, str], asyncio.Task[ToolList]] = {}
        self._reads: dict[tuple[str, str], asyncio.Task[ToolList | None]] = {}
        self._deletes: set[asyncio.Task[None]] = set()
        # Names this process in the NOTIFY of its drops, so it knows them when they come back.
        self._origin = uuid.uuid4().hex
        # For the metrics: lists answered from the cache, and fetched.
        self.hits = 0
        self.misses = 0
        caches.register(self, {TABLE: self._heard, "servers": self._server_changed})

    @classmethod
    def from_app(cls, app: web.Application) -> ToolLists:
        settings = app[SETTINGS]
        return cls(
            app[SHARED_CACHE],
            app[HTTP],
            app[POOL],
            app[CACHES],
            app[TOOL_LIST_MEMORY],
            ttl=settings.tools_cache_seconds,
            # The proxy's bound: the playground answers 504 where the proxy would.
            timeout=settings.proxy_timeout_seconds,
            secret=settings.jwt_secret,
            watch=app[TOOL_WATCH],
        )

    async def get(self, upstream: Upstream) -> ToolList:
        """The cached list, else a fresh one (BadGateway / GatewayTimeout if that fails)."""
        fingerprint = self._fingerprint(upstream)
        if self._caching:
            read = (self._key(upstream.id, self._stamp(upstream.id)), fingerprint)
            reading = self._reads.get(read)
            if reading is None:
                reading = asyncio.create_task(self._load(*read, upstream.workspace_id))
                self._reads[read] = reading
                reading.add_done_callback(lambda done: self._read_landed(read, done))
            # Shielded like a fetch: one waiter going away must not cancel the others' read.
            cached = await asyncio.shield(reading)
            if cached is not None:
                self.hits += 1
                return cached
        self.misses += 1
        flight = (upstream.id, fingerprint)
        task = self._fetches.get(flight)
        if task is None:
            task = asyncio.create_task(self._fetch(upstream, fingerprint))
            self._fetches[flight] = task
            task.add_done_callback(lambda done: self._landed(flight, done))
        # Shielded: a waiter that goes away (client disconnect) must not cancel the others'.
        return await asyncio.shield(task)

    async def drop(self, server_id: uuid.UUID) -> None:
        """Forget a server's list here, in the shared cache and (NOTIFY) in every process."""
        old_key = self._key(server_id, self._stamp(server_id))
        self._forget(server_id)
        try:
            await self._cache.delete(old_key)
        except _CACHE_ERRORS as exc:
            raise ServiceUnavailable(f"the tool list cache is unavailable: {exc}") from None
        payload = f"{TABLE}:{server_id}:{self._origin}"
        await self._pool.execute("SELECT pg_notify($1, $2)", CHANNEL, payload)

    def clear(self) -> None:
        """Called when the listener connects or is lost: anything may have changed unheard."""
        self._clears += 1
        self._epochs.clear()

    async def close(self) -> None:
        tasks = [*self._fetches.values(), *self._reads.values(), *self._deletes]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def _caching(self) -> bool:
        return self._shared or self.enabled

    async def _fetch(self, upstream: Upstream, fingerprint: str) -> ToolList:
        stamp = self._stamp(upstream.id)
        hold = self.memory.hold(upstream.workspace_id)
        try:
            try:
                async with mcp_session(self._http, upstream, self._timeout) as client:
                    listed = await client.list_tools(hold)
            except McpTimeoutError as exc:
                raise GatewayTimeout(f"cannot list the server's tools: {exc}") from None
            except McpError as exc:
                raise BadGateway(f"cannot list the server's tools: {exc}") from None
            tools = [_descriptor(tool) for tool in listed if isinstance(tool.get("name"), str)]
            if self._watch is not None:
                # As listed, not as kept here (a missing description is no empty one).
                self._watch.seen_later(upstream.id, definitions(listed))
            del listed
            fresh = self._holding(ToolList(tools, datetime.now(UTC), cached=False), hold)
        except BaseException:
            hold.release()
            raise
        # Not stored if the list was dropped (or listening changed) while it was being fetched.
        if self._caching and stamp == self._stamp(upstream.id):
            entry = {
                # As text: whoever reads it parses it only once its memory is granted.
                "tools_json": orjson.dumps(tools).decode(),
                "fetched_at": fresh.fetched_at.isoformat(),
                "fingerprint": fingerprint,
            }
            await self._write(self._key(upstream.id, stamp), entry)
        return fresh

    async def _load(self, key: str, fingerprint: str, owner: uuid.UUID) -> ToolList | None:
        """The cached list, parsed within this process's memory for tool lists, or None."""
        entry = await self._read(key)
        if entry is None or entry.get("fingerprint") != fingerprint:
            return None
        text, fetched_at = entry.get("tools_json"), entry.get("fetched_at")
        if not isinstance(text, str) or not isinstance(fetched_at, str):
            return None
        del entry
        hold = self.memory.hold(owner)
        try:
            try:
                async with asyncio.timeout(self._timeout):
                    await hold.grow(parsed_size(text))
            except TimeoutError:
                raise GatewayTimeout(
                    "cannot read the server's cached tool list: other large tool lists held the "
                    f"memory for them for {self._timeout:g} s"
                ) from None
            except ToolListTooLarge as exc:  # only if the bounds were lowered since
                raise BadGateway(f"cannot list the server's tools: {exc}") from None
            tools = orjson.loads(text)
            del text
            listing = ToolList(tools, datetime.fromisoformat(fetched_at), cached=True)
            return self._holding(listing, hold)
        except BaseException:
            hold.release()
            raise

    @staticmethod
    def _holding(listing: ToolList, hold: ToolListHold) -> ToolList:
        """`listing`, which gives its memory back once nothing uses it any more."""
        weakref.finalize(listing, hold.release)
        return listing

    def _read_landed(self, read: tuple[str, str], task: asyncio.Task[ToolList | None]) -> None:
        if self._reads.get(read) is task:
            del self._reads[read]

    def _landed(self, flight: tuple[uuid.UUID, str], task: asyncio.Task[ToolList]) -> None:
        # Only if it is still the current fetch: a drop may have detached it already.
        if self._fetches.get(flight) is task:
            del self._fetches[flight]

    def _heard(self, key: str) -> None:
        server_id, _, origin = key.partition(":")
        # Our own drop has forgotten already: again would void a fetch begun since.
        if origin != self._origin:
            self._forget(uuid.UUID(server_id))

    def _server_changed(self, key: str) -> None:
        # The fingerprint already keeps a changed server's old list from being served; this
        # keeps it from coming back should the server return to its old url and credentials.
        server_id = uuid.UUID(key)
        self._forget(server_id)
        if self._shared:
            task = asyncio.create_task(
                self._delete_quietly(self._key(server_id, self._stamp(server_id)))
            )
            self._deletes.add(task)
            task.add_done_callback(self._deletes.discard)

    def _forget(self, server_id: uuid.UUID) -> None:
        self._epochs[server_id] = self._epochs.get(server_id, 0) + 1
        # Requests from now on start a new fetch; the detached one still answers its waiters.
        for flight in [f for f in self._fetches if f[0] == server_id]:
            del self._fetches[flight]

    def _stamp(self, server_id: uuid.UUID) -> tuple[int, int]:
        return self._clears, self._epochs.get(server_id, 0)

    def _key(self, server_id: uuid.UUID, stamp: tuple[int, int]) -> str:
        if self._shared:
            return f"{ENTRY}:{server_id}"
        return f"{ENTRY}:{server_id}:{stamp[0]}.{stamp[1]}"

    def _fingerprint(self, upstream: Upstream) -> str:
        material = orjson.dumps([upstream.url, sorted(upstream.auth_headers.items())])
        return hmac.new(self._secret, material, hashlib.sha256).hexdigest()

    async def _read(self, key: str) -> dict[str, Any] | None:
        # A cache outage costs a fetch per request, not the endpoint.
        try:
            entry = await self._cache.get(key)
        except _CACHE_ERRORS as exc:
            log.warning("tool list cache unavailable, fetching instead: %s", exc)
            return None
        return entry if isinstance(entry, dict) else None

    async def _write(self, key: str, entry: dict[str, Any]) -> None:
        try:
            await self._cache.set(key, entry, ttl=self._ttl)
        except _CACHE_ERRORS as exc:
            log.warning("tool list cache unavailable, not storing: %s", exc)

    async def _delete_quietly(self, key: str) -> None:
        try:
            await self._cache.delete(key)
        except _CACHE_ERRORS as exc:
            log.warning("tool list cache unavailable, not dropping %s: %s", key, exc)


# What a tool object keeps of what the server listed (a toolset lists them to its clients).
_TOOL_FIELDS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")


def _descriptor(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as the lists keep it: its definition, where a missing description or schema
    gets a neutral one."""
    kept = {field: tool[field] for field in _TOOL_FIELDS if field in tool}
    description = tool.get("description")
    schema = tool.get("inputSchema")
    kept["description"] = description if isinstance(description, str) else ""
    kept["inputSchema"] = schema if isinstance(schema, dict) else {"type": "object"}
    return kept


# The playground's upstream tool lists (kept in SHARED_CACHE).
TOOL_LISTS: web.AppKey[ToolLists] = web.AppKey("tool_lists")
# What this process holds of upstream tool lists at once (playground and probes alike).
TOOL_LIST_MEMORY: web.AppKey[ToolListMemory] = web.AppKey("tool_list_memory")
