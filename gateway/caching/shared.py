"""The response cache shared by every gateway process: tool lists and analytics answers.

In memory by default; in Redis when REDIS_URL is set, so several processes share one copy
(and one DELETE empties it for all of them). Values are JSON, encoded with orjson.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import orjson
from aiocache import RedisCache, SimpleMemoryCache
from aiocache.base import BaseCache
from aiocache.serializers import BaseSerializer
from aiohttp import web


class OrjsonSerializer(BaseSerializer):  # type: ignore[misc]  # aiocache is untyped
    DEFAULT_ENCODING = None  # bytes in and out: Redis returns them undecoded

    def dumps(self, value: Any) -> bytes:
        return orjson.dumps(value)

    def loads(self, value: bytes | None) -> Any:
        return None if value is None else orjson.loads(value)


def create_shared_cache(redis_url: str | None) -> BaseCache:
    """A cache for JSON values; callers give each entry a ttl and a key of their own prefix."""
    if redis_url is None:
        return SimpleMemoryCache(serializer=OrjsonSerializer())
    url = urllib.parse.urlsplit(redis_url)
    database = url.path.strip("/")
    return RedisCache(
        serializer=OrjsonSerializer(),
        endpoint=url.hostname or "127.0.0.1",
        port=url.port or 6379,
        db=int(database) if database else 0,
        password=urllib.parse.unquote(url.password) if url.password else None,
        ssl=url.scheme == "rediss",
        namespace="mcp-gateway",
    )


def is_shared(cache: BaseCache) -> bool:
    """True when every process sees the same entries (Redis), so a drop needs no broadcast."""
    return isinstance(cache, RedisCache)


# Tool lists and analytics answers: in memory, or in Redis shared by every process.
SHARED_CACHE = web.AppKey("shared_cache", BaseCache)
