"""The embedded PostgreSQL used when no DATABASE_URL is configured (pgserver, a pip package)."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def start_embedded(data_dir: Path) -> str:
    """Start (or join) the PostgreSQL under data_dir/postgres and return its DSN.

    pgserver keeps one server per directory and stops it when the last process using it exits.
    """
    import pgserver  # imported lazily: it is only needed without DATABASE_URL

    pg_dir = data_dir / "postgres"
    pg_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pg_dir, cleanup_mode="stop")
    dsn: str = server.get_uri()
    log.info("embedded PostgreSQL running under %s", pg_dir)
    return dsn
