"""API key values: `mcpg_` followed by 32 bytes of URL-safe randomness."""

from __future__ import annotations

import secrets

KEY_PREFIX = "mcpg_"
# The list shows this many leading characters so users can tell keys apart.
DISPLAY_PREFIX_LENGTH = 12


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def looks_like_api_key(raw: str) -> bool:
    return raw.startswith(KEY_PREFIX) and 20 < len(raw) < 200
