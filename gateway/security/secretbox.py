"""Encryption of stored upstream credentials with rotatable keys (MultiFernet)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web
from cryptography.fernet import Fernet, InvalidToken, MultiFernet


class SecretBox:
    """The first key encrypts; every key decrypts, so keys can be rotated without downtime."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        if not keys:
            raise ValueError("at least one key is required")
        self._fernet = MultiFernet([Fernet(k) for k in keys])

    def seal(self, value: dict[str, Any]) -> bytes:
        return self._fernet.encrypt(orjson.dumps(value))

    def open(self, token: bytes) -> dict[str, Any]:
        try:
            value: dict[str, Any] = orjson.loads(self._fernet.decrypt(token))
        except InvalidToken:
            raise ValueError(
                "stored credentials cannot be decrypted with the configured keys"
            ) from None
        return value

    def rotate(self, token: bytes) -> bytes:
        """Re-encrypt with the first key."""
        return self._fernet.rotate(token)


SECRET_BOX: web.AppKey[SecretBox] = web.AppKey("secret_box")
