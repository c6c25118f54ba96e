"""Password hashes: argon2id at OWASP's parameters; hashes made with others still verify."""

from __future__ import annotations

import pytest
from argon2 import PasswordHasher

from gateway.security.passwords import hash_password, verify_password

# The real parameters are what is under test here.
pytestmark = pytest.mark.real_password_hashing


async def test_hashes_are_argon2id_at_19_mib_two_passes_one_lane() -> None:
    made = await hash_password("correct horse")
    assert made.startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    assert await verify_password(made, "correct horse")
    assert not await verify_password(made, "wrong horse")


async def test_hashes_of_other_parameters_still_verify() -> None:
    older = PasswordHasher(time_cost=1, memory_cost=8 * 1024, parallelism=2).hash("s3cret!")
    assert await verify_password(older, "s3cret!")
    assert not await verify_password(older, "s3cret?")
    assert not await verify_password(None, "s3cret!")  # no such user: still a full verify
    assert not await verify_password("not a hash", "s3cret!")
