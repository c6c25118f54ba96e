"""A PostgreSQL server of a test's own, frozen or restarted."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg


def _cluster_pids(postmaster: int) -> list[int]:
    """The postmaster and every process it started (backends, background workers)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == postmaster:
                    children.append(int(entry.name))
    return [*children, postmaster]


@contextlib.contextmanager
def frozen(server: Any) -> Iterator[None]:
    """Every process of the PostgreSQL server stopped, as by a hung machine, then resumed."""
    pids = _cluster_pids(server.get_pid())
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def restart_postgres(server: Any) -> None:
    from pgserver._commands import pg_ctl

    pg_ctl(
        ["-w", "-m", "fast", "-l", str(server.log), "restart"],
        pgdata=server.pgdata,
        user=server.system_user,
        timeout=60,
    )


def with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{name}"))


@contextlib.asynccontextmanager
async def scratch_database(
    admin_dsn: str, prefix: str, template: str | None = None
) -> AsyncIterator[str]:
    """A new database (a copy of `template`, else empty), dropped on exit; yields its DSN."""
    name = f"{prefix}_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(
            f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else "")
        )
        yield with_database(admin_dsn, name)
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()
