"""The mcp-gateway command: serve, migrate, rotate-secrets, rollups rebuild."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import uvloop
from aiohttp import web

from gateway.config import ConfigError, Settings, with_local_secrets
from gateway.db.embedded import start_embedded
from gateway.db.pool import create_pool
from gateway.db.schema import apply_schema
from gateway.db.types import Connection

T = TypeVar("T")

log = logging.getLogger("gateway")

# Net allocations between young-generation collections; the default is 700. With 64 requests
# in flight, live request objects alone crossed 700 all the time: 1,200 collections per 20,000
# proxied calls. Requests make next to no cyclic garbage, so at 10,000 they almost never run.
_GC_YOUNG_THRESHOLD = 10_000


def _worker_count(raw: str) -> int:
    if raw == "auto":
        return os.cpu_count() or 1
    count = int(raw)
    if count < 1:
        raise argparse.ArgumentTypeError("must be at least 1, or auto")
    return count


def _settings() -> Settings:
    """Settings from the environment, with the embedded PostgreSQL when DATABASE_URL is unset."""
    settings = with_local_secrets(Settings.from_env())
    if settings.database_url is None:
        settings = settings.replace(database_url=start_embedded(settings.data_dir))
    return settings


def serve(args: argparse.Namespace) -> None:
    settings = _settings()
    settings = settings.replace(
        host=args.host or settings.host,
        port=args.port or settings.port,
        workers=args.workers or settings.workers,
    )
    if settings.workers == 1:
        log.info("mcp-gateway listening on http://%s:%d", settings.host, settings.port)
        serve_process(settings)
        return
    from gateway.ops.supervisor import Supervisor

    log.info(
        "mcp-gateway listening on http://%s:%d with %d worker processes",
        settings.host,
        settings.port,
        settings.workers,
    )
    Supervisor(settings, settings.workers, serve_process).run()


def serve_process(settings: Settings) -> None:
    """One gateway process until SIGTERM or SIGINT (then it drains). A worker of several binds
    the shared port with SO_REUSEPORT; it starts in a fresh interpreter, so it sets up its log."""
    from gateway.app import create_app  # the app pulls in everything; other commands need less

    if settings.worker_id:
        _configure_logging(f"worker {settings.worker_id} ")
    if settings.database_url is not None:
        name = f"mcp-gateway worker {settings.worker_id}" if settings.worker_id else "mcp-gateway"
        settings = settings.replace(database_url=with_application_name(settings.database_url, name))
    app = create_app(settings)
    app.on_startup.append(_freeze_startup_objects)  # after the cleanup contexts have started
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        reuse_port=settings.workers > 1,
        loop=uvloop.new_event_loop(),
        access_log=None,
        print=None,
        # Drain in-flight requests (and the call log, via cleanup) on SIGTERM.
        shutdown_timeout=30,
        # A caller that hangs up cancels its handler, as under aiohttp's test server: the
        # proxy then closes the upstream request at once (instead of holding it until the
        # upstream next writes) and logs the call as cancelled by the caller.
        handler_cancellation=True,
    )


def with_application_name(dsn: str, name: str) -> str:
    """The DSN with `application_name` set, unless it sets one already: pg_stat_activity then
    says which process (and which worker) holds each connection."""
    parts = urlsplit(dsn)
    if any(key == "application_name" for key, _ in parse_qsl(parts.query)):
        return dsn
    # Appended to the query as it is: the other parameters stay exactly as written.
    added = urlencode({"application_name": name}, quote_via=quote)
    return urlunsplit(parts._replace(query=f"{parts.query}&{added}" if parts.query else added))


def _configure_logging(prefix: str = "") -> None:
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("pgserver").setLevel(logging.WARNING)  # it logs every pg_ctl call


async def _freeze_startup_objects(_app: web.Application) -> None:
    """Keep the garbage collector off the hot path: it took ~55 µs per proxied call (bench/proxy.py
    at c=64). Everything built at startup lives as long as the process, yet each full
    collection walked it all again (~50 ms each); frozen, it is never scanned."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def _database_only() -> str:
    """DATABASE_URL, or the embedded PostgreSQL, for commands that need no secrets."""
    settings = Settings.from_env()
    return settings.database_url or start_embedded(settings.data_dir)


def _on_connection(dsn: str, work: Callable[[Connection], Awaitable[T]]) -> T:
    async def run() -> T:
        pool = await create_pool(dsn, min_size=1, max_size=1)
        try:
            async with pool.acquire() as conn:
                return await work(conn)
        finally:
            await pool.close()

    return uvloop.run(run())


def migrate(_args: argparse.Namespace) -> None:
    # The schema needs no secrets, so a migration job need not be given them.
    keep_days = Settings.from_env().tool_call_retention_days

    async def work(conn: Connection) -> int:
        return await apply_schema(conn, tool_call_retention_days=keep_days)

    print(f"schema is at version {_on_connection(_database_only(), work)}")


def rotate_secrets(_args: argparse.Namespace) -> None:
    from gateway.security.rotation import RotationReport, rotate_credentials
    from gateway.security.secretbox import SecretBox

    # Only the encryption keys are needed (not the JWT secret).
    settings = Settings.from_env()
    if settings.database_url is None:
        settings = with_local_secrets(settings)
    elif not settings.secret_keys:
        raise ConfigError("GATEWAY_SECRET_KEYS: must be set (the new key first, then the old)")
    dsn = settings.database_url or start_embedded(settings.data_dir)

    async def run() -> RotationReport:
        pool = await create_pool(dsn, min_size=1, max_size=1)
        try:
            return await rotate_credentials(pool, SecretBox(settings.secret_keys))
        finally:
            await pool.close()

    report = uvloop.run(run())
    print(f"re-encrypted the credentials of {report.rotated} servers with the first key")
    if report.skipped:
        print(f"{report.skipped} servers changed meanwhile and were sealed by a gateway")
    if report.undecryptable:
        ids = ", ".join(str(i) for i in report.undecryptable)
        print(f"no configured key decrypts the credentials of servers: {ids}", file=sys.stderr)
        raise SystemExit(1)


def rebuild_rollups(args: argparse.Namespace) -> None:
    from gateway.db.rollups import rebuild

    started = time.monotonic()
    done = _on_connection(_database_only(), lambda conn: rebuild(conn, args.workspace))
    scope = "every workspace" if args.workspace is None else f"workspace {args.workspace}"
    print(
        f"rebuilt the hourly rollups of {scope} in {time.monotonic() - started:.1f} s: "
        f"{done.deleted} rows replaced by {done.inserted}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="mcp-gateway", description="Gateway and monitoring service for MCP servers."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="run the HTTP server")
    serve_cmd.add_argument("--host", help="address to bind (default GATEWAY_HOST or 127.0.0.1)")
    serve_cmd.add_argument("--port", type=int, help="port (default GATEWAY_PORT or 8080)")
    serve_cmd.add_argument(
        "--workers",
        type=_worker_count,
        help="processes sharing the port: a number, or auto for one per core "
        "(default GATEWAY_WORKERS or 1)",
    )
    serve_cmd.set_defaults(run=serve)
    commands.add_parser("migrate", help="create or upgrade the database schema").set_defaults(
        run=migrate
    )
    commands.add_parser(
        "rotate-secrets",
        help="re-encrypt stored credentials with the first key of GATEWAY_SECRET_KEYS",
        description="Key rotation: run every gateway with GATEWAY_SECRET_KEYS=NEW,OLD, run "
        "this, then remove OLD.",
    ).set_defaults(run=rotate_secrets)
    rollups_cmd = commands.add_parser("rollups", help="maintain the hourly tool call rollups")
    rollups = rollups_cmd.add_subparsers(dest="rollups_command", required=True)
    rebuild_cmd = rollups.add_parser(
        "rebuild",
        help="recompute the hourly rollups from the raw tool calls",
        description="Recompute the hourly rollups (tool_call_hourly, tool_call_caller_hourly, "
        "latency_hourly) from tool_calls in one transaction (after a bulk import or restore). "
        "Writers of tool calls wait until it commits; reads go on.",
    )
    rebuild_cmd.add_argument(
        "--workspace", type=uuid.UUID, metavar="ID", help="only this workspace (default: all)"
    )
    rebuild_cmd.set_defaults(run=rebuild_rollups)
    args = parser.parse_args(argv)
    _configure_logging()
    try:
        args.run(args)
    except ConfigError as exc:
        print(f"mcp-gateway: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
