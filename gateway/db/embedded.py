"""The embedded PostgreSQL used when no DATABASE_URL is configured (pgserver, a pip package)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

log = logging.getLogger(__name__)


def start_embedded(data_dir: Path) -> str:
    """Start (or join) the PostgreSQL under data_dir/postgres and return its DSN.

    pgserver keeps one server per directory and stops it when the last process using it exits.
    """
    pg_dir = data_dir / "postgres"
    pg_dir.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # platformdirs warns, through pgserver, when XDG_RUNTIME_DIR is unset (as under sudo,
        # in containers): pgserver falls back to /tmp and works, so the warning says nothing.
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import pgserver  # imported lazily: it is only needed without DATABASE_URL

        server = pgserver.get_server(pg_dir, cleanup_mode="stop")
    dsn: str = server.get_uri()
    log.info("data in %s (embedded PostgreSQL; set DATABASE_URL to use your own)", data_dir)
    return dsn
