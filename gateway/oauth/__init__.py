"""OAuth 2.1 for MCP clients: the gateway as the authorization server for its own accounts,
and every proxy and toolset MCP URL as a protected resource (MCP authorization spec).

The authorization server: its metadata and the aiohttp face of authlib's components (server),
clients, registered or known by their metadata document (clients), the authorize endpoint
and its consent page (consent), and registration, token and revocation (endpoints). The
protected resources: where their metadata is (resources).

OAuth needs a right PUBLIC_URL: it is the issuer, and every token's audience is an MCP URL
under it. It is served only when PUBLIC_URL is https, or loopback (a gateway tried out on
one machine); otherwise its endpoints answer 404 saying why, and API keys work as before.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from gateway.config import Settings


def oauth_refusal(settings: Settings) -> str | None:
    """Why OAuth is off on this gateway, or None when it is on."""
    if not settings.oauth:
        return "OAuth is off: GATEWAY_OAUTH=off"
    parts = urlsplit(settings.base_url)
    if parts.scheme == "https" or (parts.scheme == "http" and _loopback(parts.hostname)):
        return None
    return (
        f"OAuth is off: PUBLIC_URL must be https (or a loopback http URL), not "
        f"{settings.base_url!r}: set PUBLIC_URL to the https address clients reach the gateway at"
    )


def oauth_enabled(settings: Settings) -> bool:
    return oauth_refusal(settings) is None


def _loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
