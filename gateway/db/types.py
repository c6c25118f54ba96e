"""Types and small helpers shared by the SQL modules."""

from __future__ import annotations

from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

# A connection, whether made directly or acquired from the pool.
Connection: TypeAlias = asyncpg.Connection | PoolConnectionProxy
# Single statements run on either the pool or a connection inside a transaction.
Executor: TypeAlias = asyncpg.Pool | Connection

# PostgreSQL's bigint: larger numbers cannot even be sent to it.
BIGINT_MAX = 2**63 - 1


def like_pattern(text: str) -> str:
    """A case-insensitive substring pattern (for ILIKE) in which % and _ match only
    themselves."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"
