"""What "the database is unavailable" means, defined once for the API, the call log and the
background loops."""

from __future__ import annotations

import asyncpg

# What asyncpg raises while PostgreSQL restarts, fails over, is unreachable or too slow: the
# API answers 503 with Retry-After, the call log pauses its writing and retries.
DATABASE_DOWN: tuple[type[BaseException], ...] = (
    # OSError, not only ConnectionError: connecting to a unix socket (the embedded PostgreSQL)
    # while the server restarts raises FileNotFoundError. TimeoutError is an OSError too: the
    # client's bounds on acquiring a connection and on a statement raise it.
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    # A pooled connection that died mid-query and is used again ("another operation is in
    # progress").
    asyncpg.exceptions.InternalClientError,
    asyncpg.exceptions.OperatorInterventionError,
    # 53xxx, e.g. too many connections while every client reconnects after a restart.
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,  # failover in progress
    # A statement over GATEWAY_DB_STATEMENT_TIMEOUT_SECONDS, cancelled by the server.
    asyncpg.exceptions.QueryCanceledError,
)

# What a background loop (or a limiter's storage) gets from PostgreSQL when something is wrong
# there: the database down, or any error it reports. The loop logs it, waits, and tries again.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_DOWN, asyncpg.PostgresError)
