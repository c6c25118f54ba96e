"""OAuth grants in tests, made as /oauth/token makes them (a client row, a grant row, an access
token under the app's JWT secret for one MCP URL), so the protected resources are tested
without running the authorization flow (tests/oauth/ of the authorization server does that)."""

from __future__ import annotations

import re
import secrets
import uuid
from dataclasses import dataclass

from gateway.keys import POOL, SETTINGS
from gateway.oauth.resources import resource_url
from gateway.security.tokens import OAuthClaims, issue_oauth_token
from tests.helpers.api import Account, Api

# An https PUBLIC_URL: the gateway offers OAuth only then, or on loopback (which the dashboard
# tests use: over https its cookies are Secure, and the test client speaks plain http).
OAUTH_PUBLIC_URL = "https://gateway.test"
LOOPBACK_PUBLIC_URL = "http://localhost:8000"

_MCP_PATH = re.compile(r"^/api/v1/(proxy|toolsets)/([0-9a-f-]{36})/mcp$")


@dataclass(frozen=True)
class Granted:
    grant_id: uuid.UUID
    token: str
    # The MCP URL it was granted for (absolute, under PUBLIC_URL) and its path.
    resource: str
    path: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


async def grant(
    api: Api,
    member: Account,
    path: str,
    client_name: str = "Claude",
    *,
    client_id: str | None = None,
    ttl_seconds: int = 3600,
) -> Granted:
    """`member` allowed a client named `client_name` to use the MCP URL at `path`
    (/api/v1/proxy/{id}/mcp or /api/v1/toolsets/{id}/mcp) of their current workspace."""
    found = _MCP_PATH.match(path)
    assert found is not None, f"not an MCP URL: {path}"
    kind, target = found.group(1), uuid.UUID(found.group(2))
    settings = api.app[SETTINGS]
    pool = api.app[POOL]
    resource = resource_url(settings.base_url, path)
    client_id = client_id or f"client-{secrets.token_hex(6)}"
    await pool.execute(
        "INSERT INTO oauth_clients (client_id, client_name, redirect_uris, metadata, registered) "
        "VALUES ($1, $2, $3, $4, true) ON CONFLICT (client_id) DO NOTHING",
        client_id,
        client_name,
        ["http://127.0.0.1:33418/callback"],
        {"client_name": client_name},  # (the pool encodes JSON itself)
    )
    grant_id = await pool.fetchval(
        "INSERT INTO oauth_grants (workspace_id, user_id, client_id, client_name, resource, "
        "server_id, toolset_id) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        uuid.UUID(member.workspace_id),
        uuid.UUID(member.user_id),
        client_id,
        client_name,
        resource,
        target if kind == "proxy" else None,
        target if kind == "toolsets" else None,
    )
    claims = OAuthClaims(
        grant_id, uuid.UUID(member.user_id), uuid.UUID(member.workspace_id), resource
    )
    token = issue_oauth_token(settings.jwt_secret, ttl_seconds, claims, settings.base_url)
    return Granted(grant_id, token, resource, path)


def proxy_path(server_id: str) -> str:
    return f"/api/v1/proxy/{server_id}/mcp"


def toolset_path(toolset_id: str) -> str:
    return f"/api/v1/toolsets/{toolset_id}/mcp"
