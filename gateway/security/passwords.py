"""argon2id password hashing.

OWASP's parameters (19 MiB, 2 passes, 1 lane) rather than argon2-cffi's default profile
(64 MiB, 3 passes, 4 lanes): each hash holds its memory for its whole run, and a burst of
logins ran several at once in the thread pool, 64 MiB each, taking a 80 MB process past
300 MB. Hashes made with other parameters still verify (they are in the hash string).
"""

from __future__ import annotations

import asyncio
import os
import threading

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_hasher = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)

# Verifying against this keeps unknown emails as slow as wrong passwords (no user enumeration).
_DUMMY_HASH = _hasher.hash("not-a-real-password")

# Hashes running at once in this process: more than the cores buys no throughput (argon2 is
# all CPU), only memory. The others wait in their pool thread, not on the event loop.
_RUNNING = threading.BoundedSemaphore(os.cpu_count() or 1)


async def hash_password(password: str) -> str:
    # argon2 is deliberately slow (tens of ms): keep it off the event loop.
    def make() -> str:
        with _RUNNING:
            return _hasher.hash(password)

    return await asyncio.to_thread(make)


async def verify_password(password_hash: str | None, password: str) -> bool:
    def verify() -> bool:
        try:
            with _RUNNING:
                return _hasher.verify(password_hash or _DUMMY_HASH, password) and bool(
                    password_hash
                )
        except (VerificationError, InvalidHashError):
            return False

    return await asyncio.to_thread(verify)
