"""Gateway processes in tests: the secrets they share, and an environment without the
caller's gateway settings."""

from __future__ import annotations

import os
import secrets

from cryptography.fernet import Fernet

SECRETS = {
    "GATEWAY_JWT_SECRET": secrets.token_urlsafe(48),
    "GATEWAY_SECRET_KEYS": Fernet.generate_key().decode(),
}


def environment(**values: str) -> dict[str, str]:
    """This process's environment without any gateway settings, plus `values`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GATEWAY_") and k not in ("DATABASE_URL", "SMTP_URL", "PUBLIC_URL")
    }
    return {**env, **values}
