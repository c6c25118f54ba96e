"""Registered servers as the proxy and the MCP client reach them, cached in-process."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg
from aiohttp import web

from gateway.caching.caches import MISSING, Caches, InvalidatedCache
from gateway.db import servers as servers_db
from gateway.policy.rules import ServerRules
from gateway.security.credentials import upstream_auth_headers
from gateway.security.secretbox import SecretBox


@dataclass(frozen=True, slots=True)
class Upstream:
    id: uuid.UUID
    workspace_id: uuid.UUID
    name: str
    url: str
    # The server's stored credentials as request headers; never log these.
    auth_headers: dict[str, str]
    # What nobody may do with it (disabled tools, a rate limit); None: nothing withheld.
    rules: ServerRules | None = None


class Upstreams:
    """server id -> Upstream, with credentials decrypted once rather than per request.

    Dropped on any change of url, credentials or rules, in every process (schema.sql's trigger
    on servers); call forget() after a change so this process does not wait for the NOTIFY.
    """

    def __init__(self, pool: asyncpg.Pool, box: SecretBox, caches: Caches) -> None:
        self._pool = pool
        self._box = box
        self._cache: InvalidatedCache[uuid.UUID, Upstream | None] = InvalidatedCache("servers")
        caches.register(self._cache, {"servers": lambda key: self._cache.drop(uuid.UUID(key))})

    def peek(self, server_id: uuid.UUID, workspace_id: uuid.UUID) -> Upstream | None:
        """As get() when the server is cached, else MISSING: the proxy's every call tries
        this first, so a cache hit costs no coroutine."""
        upstream = self._cache.peek(server_id)
        if upstream is MISSING:
            return MISSING
        if upstream is None or upstream.workspace_id != workspace_id:
            return None
        return upstream

    async def get(self, server_id: uuid.UUID, workspace_id: uuid.UUID) -> Upstream | None:
        """The server, or None when it does not exist or belongs to another workspace."""
        upstream = self._cache.peek(server_id)
        if upstream is MISSING:
            upstream = await self._cache.get(server_id, lambda: self._load(server_id))
        if upstream is None or upstream.workspace_id != workspace_id:
            return None
        return upstream

    def forget(self, server_id: uuid.UUID) -> None:
        self._cache.drop(server_id)

    async def _load(self, server_id: uuid.UUID) -> Upstream | None:
        row = await servers_db.upstream(self._pool, server_id)
        if row is None:
            return None
        credentials = None if row.credentials is None else self._box.open(row.credentials)
        return Upstream(
            id=row.id,
            workspace_id=row.workspace_id,
            name=row.name,
            url=row.url,
            auth_headers=upstream_auth_headers(row.auth_type, credentials),
            rules=ServerRules.of(
                row.id, row.disabled_tools or (), row.rate_limit, row.approved_tools
            ),
        )


UPSTREAMS: web.AppKey[Upstreams] = web.AppKey("upstreams")
