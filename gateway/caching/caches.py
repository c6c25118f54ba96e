"""In-process caches for per-request lookups, dropped on PostgreSQL NOTIFY from any process."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

from aiohttp import web

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# What peek() returns for a key not cached (None is a value: "known not to exist").
MISSING: Any = object()


class InvalidatedCache(Generic[K, V]):
    """A bounded TTL cache that never stores a value loaded before an invalidation.

    NOTIFY is the source of truth for freshness; the TTL only bounds the damage if a
    notification were ever lost while the listener was connected. Entries live in a plain dict
    (key -> (value, expiry)) rather than a cachetools.TTLCache, whose Python-level lookup cost a
    microsecond, twice per proxied call; when full, the oldest entry makes room.
    """

    def __init__(self, name: str, *, maxsize: int = 100_000, ttl: float = 300.0) -> None:
        self.name = name
        self._maxsize = maxsize
        self._ttl = ttl
        self._data: dict[K, tuple[V, float]] = {}
        # Bumped by every drop, so a load that raced with an invalidation is not cached.
        self._generation = 0
        # Off while no NOTIFY listener is connected: then nothing is cached, every get loads.
        self.enabled = False
        # For the metrics: lookups answered from the cache, and loads.
        self.hits = 0
        self.misses = 0

    def peek(self, key: K) -> V:
        """The cached value, or MISSING. The hot path tries this before get(): a cache hit then
        costs no coroutine."""
        entry = self._data.get(key)
        if entry is None or entry[1] <= time.monotonic():
            return MISSING  # type: ignore[no-any-return]
        self.hits += 1
        return entry[0]

    async def get(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        value = self.peek(key)
        if value is not MISSING:
            return value
        generation = self._generation
        self.misses += 1
        value = await load()
        if self.enabled and generation == self._generation:
            self._store(key, value)
        return value

    def _store(self, key: K, value: V) -> None:
        data = self._data
        data.pop(key, None)  # re-inserted last: the oldest entry is always first
        if len(data) >= self._maxsize:
            del data[next(iter(data))]
        data[key] = (value, time.monotonic() + self._ttl)

    def drop(self, key: K) -> None:
        self._generation += 1
        self._data.pop(key, None)

    def drop_where(self, predicate: Callable[[K], bool]) -> None:
        self._generation += 1
        for key in [k for k in self._data if predicate(k)]:
            self._data.pop(key, None)

    def clear(self) -> None:
        self._generation += 1
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


Invalidator = Callable[[str], None]


class Invalidated(Protocol):
    """Anything that may only cache while NOTIFY can be heard (an InvalidatedCache, the
    playground's tool lists)."""

    enabled: bool

    def clear(self) -> None: ...


class Caches:
    """Every invalidated cache of the app, and the dispatch from NOTIFY payloads to them.

    Payloads are '<table>:<key>' as written by notify_invalidate() in schema.sql.
    """

    def __init__(self) -> None:
        self._by_table: dict[str, list[Invalidator]] = {}
        self._all: list[Invalidated] = []
        # Set once invalidations are heard: startup waits for it, so a new process serves
        # from its caches from its first request on.
        self.listening = asyncio.Event()

    def register(self, cache: Invalidated, tables: dict[str, Invalidator]) -> None:
        self._all.append(cache)
        for table, invalidate in tables.items():
            self._by_table.setdefault(table, []).append(invalidate)

    def counted(self) -> list[InvalidatedCache[Any, Any]]:
        """The caches that count their hits and misses."""
        return [cache for cache in self._all if isinstance(cache, InvalidatedCache)]

    def invalidate(self, payload: str) -> None:
        table, _, key = payload.partition(":")
        for invalidate in self._by_table.get(table, ()):
            invalidate(key)

    def set_listening(self, listening: bool) -> None:
        """Caching is only safe while invalidations can be heard; any change may have been
        missed while they could not, so every entry is dropped either way."""
        for cache in self._all:
            cache.clear()
            cache.enabled = listening
        if listening:
            self.listening.set()
        else:
            self.listening.clear()


CACHES: web.AppKey[Caches] = web.AppKey("caches")
