"""Turning a server's stored credentials into the headers sent upstream."""

from __future__ import annotations

import base64
from typing import Any

# auth_type -> the fields its credentials object must have.
CREDENTIAL_FIELDS: dict[str, tuple[str, ...]] = {
    "bearer": ("token",),
    "api_key": ("header_name", "header_value"),
    "basic": ("username", "password"),
}


def upstream_auth_headers(
    auth_type: str | None, credentials: dict[str, Any] | None
) -> dict[str, str]:
    if auth_type is None or credentials is None:
        return {}
    if auth_type == "bearer":
        return {"Authorization": f"Bearer {credentials['token']}"}
    if auth_type == "api_key":
        return {credentials["header_name"]: credentials["header_value"]}
    if auth_type == "basic":
        pair = f"{credentials['username']}:{credentials['password']}".encode()
        return {"Authorization": f"Basic {base64.b64encode(pair).decode()}"}
    raise ValueError(f"unknown auth_type {auth_type!r}")
