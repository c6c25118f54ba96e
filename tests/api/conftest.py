"""API tests hash passwords with cheap argon2id parameters: behaviour is under test, not cost."""

from __future__ import annotations

import pytest
from argon2 import PasswordHasher

from gateway.security import passwords


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    hasher = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    monkeypatch.setattr(passwords, "_hasher", hasher)
    monkeypatch.setattr(passwords, "_DUMMY_HASH", hasher.hash("not-a-real-password"))
