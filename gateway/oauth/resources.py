"""The protected resources: every proxy and toolset MCP URL, and where a client refused with
a 401 finds how to get a token for one (RFC 9728)."""

from __future__ import annotations

from typing import Any

METADATA_PREFIX = "/.well-known/oauth-protected-resource"


def resource_url(base_url: str, path: str) -> str:
    """The resource (RFC 8707) an MCP URL is: its absolute URL under PUBLIC_URL."""
    return base_url + path


def metadata_url(base_url: str, path: str) -> str:
    """Where the protected resource metadata of the MCP URL at `path` is (RFC 9728 3.1)."""
    return base_url + METADATA_PREFIX + path


def protected_resource_metadata(base_url: str, path: str) -> dict[str, Any]:
    """RFC 9728 for the MCP URL at `path`: the gateway is its one authorization server, and
    tokens come in the Authorization header only. No scopes: a token is for one MCP URL."""
    return {
        "resource": resource_url(base_url, path),
        "authorization_servers": [base_url],
        "bearer_methods_supported": ["header"],
        "resource_name": "mcp-gateway",
    }
