"""argon2id password hashing.

OWASP's parameters (19 MiB, 2 passes, 1 lane) rather than argon2-cffi's default profile
(64 MiB, 3 passes, 4 lanes): each hash holds its memory for its whole run, and a burst of
logins ran several at once in the thread pool, 64 MiB each, taking a 80 MB process past
300 MB. Hashes made with other parameters still verify (they are in the hash string).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import threading

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _return_large_blocks() -> None:
    """Have glibc map blocks of 1 MiB and more on their own, and unmap them when freed.

    Otherwise the first 19 MiB argon2 buffer freed raises glibc's threshold to 19 MiB, and
    every later buffer comes from the malloc arena of the pool thread that hashes: the memory
    stays with the process after the hash. Measured: +19 MB after one login, +114 MB after a
    burst of 36, never given back; with this, +1 MB. Python's own small objects are not
    affected (its allocator asks the system for 256 KiB arenas)."""
    # Not glibc (musl, macOS): no mallopt, and their allocators give large blocks back.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, 1 << 20)


_return_large_blocks()
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
