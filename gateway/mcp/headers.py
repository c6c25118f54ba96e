"""The 2026-07-28 header encoding: `Mcp-Name` and the `Mcp-Param-*` headers a `tools/call`
mirrors from its arguments (as the tool's inputSchema declares with `x-mcp-header`)."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any, Final

_HEADER_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_SAFE: Final = re.compile(r"[\x20-\x7e]*")
_B64_SENTINEL: Final = re.compile(r"=\?base64\?.*\?=")


def header_value(value: str) -> str:
    """Encode a value for an Mcp-Name / Mcp-Param-* header the way the 2026-07-28 spec says."""
    if (
        _HEADER_SAFE.fullmatch(value)
        and value == value.strip()
        and not _B64_SENTINEL.fullmatch(value)
    ):
        return value
    return f"=?base64?{base64.b64encode(value.encode()).decode('ascii')}?="


def header_text(value: str) -> str | None:
    """What an Mcp-Name / Mcp-Param-* header says (header_value() undone); None when its base64
    cannot be read."""
    if _B64_SENTINEL.fullmatch(value):
        try:
            return base64.b64decode(value[9:-2], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
    return value


def param_header_map(schema: Any) -> dict[tuple[str, ...], str]:
    """Argument paths whose values a 2026-07-28 `tools/call` mirrors into `Mcp-Param-*` headers.

    Only `properties` chains are followed; a schema with any invalid annotation yields no
    headers, since the spec tells servers not to validate those either.
    """
    found: dict[tuple[str, ...], str] = {}
    seen: set[str] = set()
    stack: list[tuple[tuple[str, ...], Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            continue
        token = node.get("x-mcp-header")
        if token is not None:
            if (
                not path
                or not isinstance(token, str)
                or not _HEADER_TOKEN.fullmatch(token)
                or node.get("type") not in ("string", "integer", "boolean")
                or token.lower() in seen
            ):
                return {}
            seen.add(token.lower())
            found[path] = token
        properties = node.get("properties")
        if isinstance(properties, dict):
            stack.extend(((*path, key), sub) for key, sub in properties.items())
    return found


def param_headers(
    header_map: Mapping[tuple[str, ...], str], arguments: Mapping[str, Any]
) -> dict[str, str]:
    headers: dict[str, str] = {}
    for path, token in header_map.items():
        value: Any = arguments
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, bool):
            rendered = "true" if value else "false"
        elif isinstance(value, str | int | float):
            rendered = str(value)
        else:
            continue
        headers[f"Mcp-Param-{token}"] = header_value(rendered)
    return headers


# Headers the client sets itself (lower case): a caller's or a stored credential's copy would
# contradict the negotiated state or how the request is framed.
MANAGED_HEADERS: Final = frozenset(
    {
        "accept",
        "accept-encoding",
        "content-type",
        "content-length",
        "host",
        "last-event-id",
        "mcp-method",
        "mcp-name",
        "mcp-protocol-version",
        "mcp-session-id",
    }
)
