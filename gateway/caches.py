"""In-process caches for per-request lookups, dropped on PostgreSQL NOTIFY from any process."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

from cachetools import TTLCache

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MISSING: Any = object()


class InvalidatedCache(Generic[K, V]):
    """A bounded TTL cache that never stores a value loaded before an invalidation.

    NOTIFY is the source of truth for freshness; the TTL only bounds the damage if a
    notification were ever lost while the listener was connected.
    """

    def __init__(self, name: str, *, maxsize: int = 100_000, ttl: float = 300.0) -> None:
        self.name = name
        self._data: TTLCache[K, V] = TTLCache(maxsize=maxsize, ttl=ttl)
        # Bumped by every drop, so a load that raced with an invalidation is not cached.
        self._generation = 0
        # Off while no NOTIFY listener is connected: then nothing is cached, every get loads.
        self.enabled = False

    async def get(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        value: V = self._data.get(key, _MISSING)
        if value is not _MISSING:
            return value
        generation = self._generation
        value = await load()
        if self.enabled and generation == self._generation:
            self._data[key] = value
        return value

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

    def register(self, cache: Invalidated, tables: dict[str, Invalidator]) -> None:
        self._all.append(cache)
        for table, invalidate in tables.items():
            self._by_table.setdefault(table, []).append(invalidate)

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
