"""The protected resources: every proxy and toolset MCP URL, where a client refused with a
401 finds how to get a token for one (RFC 9728), and the grants behind the tokens they accept,
cached in-process and dropped in every process the moment one is revoked."""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import quote

import asyncpg

from gateway.caching.caches import Caches, InvalidatedCache
from gateway.db import oauth_grants as grants_db
from gateway.db.oauth_grants import ActiveGrant

METADATA_PREFIX = "/.well-known/oauth-protected-resource"


def resource_url(base_url: str, path: str) -> str:
    """The resource (RFC 8707) an MCP URL is: its absolute URL under PUBLIC_URL."""
    return base_url + path


def metadata_url(base_url: str, path: str) -> str:
    """Where the protected resource metadata of the MCP URL at `path` is (RFC 9728 3.1)."""
    return base_url + METADATA_PREFIX + path


def challenge(base_url: str, path: str, *, invalid_token: bool) -> str:
    """The WWW-Authenticate of an MCP URL's 401 (RFC 9728 5.1, RFC 6750 3): where its
    metadata is, and `invalid_token` when a credential was sent and refused, so that an OAuth
    client authorizes again rather than retrying the same token."""
    # The routes take only hex digits and hyphens as an id, but the header must stay one
    # quoted string whatever a path holds.
    where = metadata_url(base_url, quote(path, safe="/-._~"))
    error = 'error="invalid_token", ' if invalid_token else ""
    return f'Bearer {error}resource_metadata="{where}"'


class Grants:
    """The grants behind OAuth access tokens, by id, from an in-process cache that the
    oauth_grants trigger's NOTIFY keeps fresh (a revoked grant ends at once in every process);
    and when each was last used, written in batches (gateway/background/last_used)."""

    def __init__(self, pool: asyncpg.Pool, caches: Caches) -> None:
        self._pool = pool
        # grant id -> the grant, or None: known not to exist (revoked, or never made).
        self.cache: InvalidatedCache[uuid.UUID, ActiveGrant | None] = InvalidatedCache(
            "oauth_grants"
        )
        # grant id -> last use (epoch seconds), until the next batch takes it.
        self.usage: dict[uuid.UUID, float] = {}
        caches.register(self.cache, {"oauth_grants": self._dropped})

    def _dropped(self, key: str) -> None:
        try:
            self.cache.drop(uuid.UUID(key))
        except ValueError:  # not a payload the trigger writes: drop everything, to be safe
            self.cache.clear()

    async def get(self, grant_id: uuid.UUID) -> ActiveGrant | None:
        return await self.cache.get(grant_id, lambda: grants_db.find(self._pool, grant_id))

    def forget(self, grant_id: uuid.UUID) -> None:
        """Drop at once in this process (a revocation here); others hear it through NOTIFY."""
        self.cache.drop(grant_id)

    def used(self, grant_id: uuid.UUID) -> None:
        self.usage[grant_id] = time.time()


def protected_resource_metadata(base_url: str, path: str) -> dict[str, Any]:
    """RFC 9728 for the MCP URL at `path`: the gateway is its one authorization server, and
    tokens come in the Authorization header only. No scopes: a token is for one MCP URL."""
    return {
        "resource": resource_url(base_url, path),
        "authorization_servers": [base_url],
        "bearer_methods_supported": ["header"],
        "resource_name": "mcp-gateway",
    }
