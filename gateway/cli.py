"""The mcp-gateway command: serve, migrate, rotate-secrets, rollups rebuild."""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import signal
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn, TypeVar
from urllib.parse import parse_qs, parse_qsl, quote, urlencode, urlsplit, urlunsplit

import asyncpg
import uvloop
from aiohttp import web

from gateway.config import ConfigError, Settings, parse_port, parse_workers, with_local_secrets
from gateway.db.embedded import start_embedded
from gateway.db.pool import create_pool
from gateway.db.schema import apply_schema
from gateway.db.types import Connection
from gateway.ops.supervisor import Report

T = TypeVar("T")

log = logging.getLogger("gateway")

# Net allocations between young-generation collections; the default is 700. With 64 requests
# in flight, live request objects alone crossed 700 all the time: 1,200 collections per 20,000
# proxied calls. Requests make next to no cyclic garbage, so at 10,000 they almost never run.
_GC_YOUNG_THRESHOLD = 10_000


class Fatal(Exception):
    """Stops the command with its message as the one line on stderr, and exit status 1: the
    world is not as the command needs it (a port taken, a database out of reach), no bug."""


class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are one line (and exit status 2) instead of the usage
    text followed by the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _argument(parse: Callable[[str], T]) -> Callable[[str], T]:
    """A setting's parser (gateway.config), for a flag: its message instead of argparse's, which
    names the function."""

    def parse_argument(raw: str) -> T:
        try:
            return parse(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse_argument


def _version() -> str:
    try:
        return version("mcp-gateway")
    except PackageNotFoundError:
        return "0.0.0"


@dataclass(frozen=True, slots=True)
class Database:
    """A DSN and what to call it in a message: where it is, and which setting said so."""

    dsn: str
    named: str

    @classmethod
    def of(cls, settings: Settings) -> Database:
        """DATABASE_URL, or the embedded PostgreSQL (started here) when it is unset."""
        if settings.database_url is not None:
            return cls(settings.database_url, f"{_address(settings.database_url)} (DATABASE_URL)")
        pg_dir = settings.data_dir / "postgres"
        return cls(start_embedded(settings.data_dir), f"the embedded PostgreSQL in {pg_dir}")

    def unreachable(self, exc: BaseException) -> Fatal:
        return Fatal(f"mcp-gateway: cannot connect to the database at {self.named}: {_why(exc)}")

    async def check(self) -> None:
        """Connect once: a database out of reach is one line, before anything else starts."""
        try:
            conn = await asyncpg.connect(self.dsn, timeout=_CONNECT_SECONDS)
        except _CONNECT_ERRORS as exc:
            raise self.unreachable(exc) from None
        await conn.close()

    async def pool(self) -> asyncpg.Pool:
        """A pool of one connection, for the maintenance commands."""
        try:
            return await create_pool(self.dsn, min_size=1, max_size=1)
        except _CONNECT_ERRORS as exc:
            raise self.unreachable(exc) from None


# What connecting raises when the database cannot be reached or refuses us: a name that does
# not resolve, a port nobody listens on, a timeout, a wrong password or database name, a DSN
# asyncpg cannot read. Anything later is a bug, with its traceback.
_CONNECT_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError)
_CONNECT_SECONDS = 10.0


def _address(dsn: str) -> str:
    """host:port as the DSN says (asyncpg's defaults filled in), or the directory of its unix
    socket (`?host=/path`, as the embedded PostgreSQL's DSN has); never its password."""
    parts = urlsplit(dsn)
    hosts = parts.netloc.rpartition("@")[2]
    socket_dirs = parse_qs(parts.query).get("host")
    if not hosts and socket_dirs:
        return socket_dirs[0]
    hosts = hosts or "localhost"
    return hosts if ":" in hosts and not hosts.endswith("]") else f"{hosts}:5432"


def _why(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return "the host name does not resolve"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is PostgreSQL running there?)"
    if isinstance(exc, TimeoutError):
        return f"no answer within {_CONNECT_SECONDS:.0f} s"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    if isinstance(exc, ValueError):
        return f"the URL cannot be read ({exc})"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _listen_error(address: str, exc: OSError) -> Fatal:
    reason = {
        errno.EADDRINUSE: "the address is already in use (another process listens there)",
        errno.EADDRNOTAVAIL: "no such address on this machine (--host or GATEWAY_HOST)",
        errno.EACCES: "permission denied (ports below 1024 need privileges)",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    return Fatal(f"mcp-gateway: cannot listen on {address}: {reason}")


def _show(address: tuple[Any, ...]) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind(host: str, port: int, *, reuse_port: bool) -> list[socket.socket]:
    """Sockets bound to every address `host` names, not listening yet: a port that is taken is
    found before anything starts, and nothing can connect before the app is ready (a bound
    socket that does not listen refuses connections)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise Fatal(f"mcp-gateway: cannot listen on {host}:{port}: {exc.strerror}") from None
    sockets: list[socket.socket] = []
    for family, kind, proto, _, address in dict.fromkeys(found):
        sock = socket.socket(family, kind, proto)
        sockets.append(sock)
        # As asyncio's own servers: a restart need not wait out the old connections' TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            for each in sockets:
                each.close()
            raise _listen_error(_show(address), exc) from None
    return sockets


def _url(sock: socket.socket) -> str:
    return f"http://{_show(sock.getsockname())}"


def _announce(url: str, workers: int) -> None:
    processes = f" with {workers} worker processes" if workers > 1 else ""
    log.info(
        "mcp-gateway %s listening on %s%s (Ctrl+C or SIGTERM stops it)",
        _version(),
        url,
        processes,
    )


def serve(args: argparse.Namespace) -> None:
    settings = with_local_secrets(Settings.from_env())
    settings = settings.replace(
        host=args.host or settings.host,
        port=args.port or settings.port,
        workers=args.workers or settings.workers,
    )
    many = settings.workers > 1
    # The port first (a second start finds it taken at once), then the database.
    sockets = bind(settings.host, settings.port, reuse_port=many)
    try:
        database = Database.of(settings)
        uvloop.run(database.check())
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    settings = settings.replace(database_url=database.dsn)
    if not many:
        serve_process(settings, sockets=sockets)
        return
    from gateway.ops.supervisor import StartFailed, Supervisor

    for sock in sockets:  # each worker binds its own, beside the others (SO_REUSEPORT)
        sock.close()
    try:
        Supervisor(
            settings, settings.workers, serve_process, partial(_announce, workers=settings.workers)
        ).run()
    except StartFailed as exc:
        raise Fatal(str(exc)) from None
    log.info("mcp-gateway stopped")


def serve_process(
    settings: Settings,
    report: Report | None = None,
    *,
    sockets: list[socket.socket] | None = None,
) -> None:
    """One gateway process until SIGTERM or SIGINT (then it drains). A worker of several binds
    the shared port with SO_REUSEPORT and reports to the parent; it starts in a fresh
    interpreter, so it sets up its log."""
    from gateway.app import create_app  # the app pulls in everything; other commands need less

    if settings.worker_id:
        _configure_logging(f"worker {settings.worker_id} ")
    if settings.database_url is not None:
        name = f"mcp-gateway worker {settings.worker_id}" if settings.worker_id else "mcp-gateway"
        settings = settings.replace(database_url=with_application_name(settings.database_url, name))
    try:
        if sockets is None:
            sockets = bind(settings.host, settings.port, reuse_port=settings.workers > 1)
        app = create_app(settings)
        app.on_startup.append(_freeze_startup_objects)  # after the cleanup contexts have started
        uvloop.run(_serve(app, settings, sockets, report))
    except Fatal as exc:
        if report is None:
            raise
        report("failed", str(exc))
        raise SystemExit(1) from None
    finally:
        for sock in sockets or ():
            sock.close()


async def _serve(
    app: web.Application,
    settings: Settings,
    sockets: list[socket.socket],
    report: Report | None,
) -> None:
    from gateway.calllog.writer import CALL_LOG
    from gateway.ops.access_log import LOGGER, AccessLog
    from gateway.proxy.handler import PROXYING

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    runner = web.AppRunner(
        app,
        # Off, aiohttp has no access logger to call: a request pays nothing for it.
        access_log=LOGGER if settings.access_log else None,
        access_log_class=AccessLog,
        # Drain in-flight requests (and the call log, via cleanup) on SIGTERM.
        shutdown_timeout=30,
        # A caller that hangs up cancels its handler, as under aiohttp's test server: the
        # proxy then closes the upstream request at once (instead of holding it until the
        # upstream next writes) and logs the call as cancelled by the caller.
        handler_cancellation=True,
    )
    await runner.setup()  # the app's startup: schema, pool, call log, background loops
    try:
        if not stop.is_set():  # a signal during startup: stop without ever listening
            for sock in sockets:
                site = web.SockSite(runner, sock)
                try:
                    await site.start()
                except OSError as exc:
                    raise _listen_error(_show(sock.getsockname()), exc) from None
            if report is not None:
                report("listening", _url(sockets[0]))
            else:
                _announce(", ".join(_url(sock) for sock in sockets), 1)
            await stop.wait()
            assert runner.server is not None
            log.info(
                "received %s: stopping; draining %d open connections (%d proxied requests in "
                "flight) and %d queued tool calls",
                received[0].name,
                len(runner.server.connections),
                app[PROXYING].in_flight.count,
                len(app[CALL_LOG]),
            )
    finally:
        await runner.cleanup()
    log.info("mcp-gateway stopped" if report is None else "stopped")


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


def _on_connection(database: Database, work: Callable[[Connection], Awaitable[T]]) -> T:
    async def run() -> T:
        pool = await database.pool()
        try:
            async with pool.acquire() as conn:
                return await work(conn)
        finally:
            await pool.close()

    return uvloop.run(run())


def migrate(_args: argparse.Namespace) -> None:
    # The schema needs no secrets, so a migration job need not be given them.
    settings = Settings.from_env()
    keep_days = settings.tool_call_retention_days

    async def work(conn: Connection) -> int:
        return await apply_schema(conn, tool_call_retention_days=keep_days)

    print(f"schema is at version {_on_connection(Database.of(settings), work)}")


def rotate_secrets(_args: argparse.Namespace) -> None:
    from gateway.security.rotation import RotationReport, rotate_credentials
    from gateway.security.secretbox import SecretBox

    # Only the encryption keys are needed (not the JWT secret).
    settings = Settings.from_env()
    if settings.database_url is None:
        settings = with_local_secrets(settings)
    elif not settings.secret_keys:
        raise ConfigError("GATEWAY_SECRET_KEYS: must be set (the new key first, then the old)")
    database = Database.of(settings)

    async def run() -> RotationReport:
        pool = await database.pool()
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
    done = _on_connection(
        Database.of(Settings.from_env()), lambda conn: rebuild(conn, args.workspace)
    )
    scope = "every workspace" if args.workspace is None else f"workspace {args.workspace}"
    print(
        f"rebuilt the hourly rollups of {scope} in {time.monotonic() - started:.1f} s: "
        f"{done.deleted} rows replaced by {done.inserted}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(
        prog="mcp-gateway", description="Gateway and monitoring service for MCP servers."
    )
    parser.add_argument("--version", action="version", version=f"mcp-gateway {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="run the HTTP server")
    serve_cmd.add_argument("--host", help="address to bind (default GATEWAY_HOST or 127.0.0.1)")
    serve_cmd.add_argument(
        "--port",
        type=_argument(parse_port),
        help="port, 1 to 65535 (default GATEWAY_PORT or 8080); 0, any free port, is refused",
    )
    serve_cmd.add_argument(
        "--workers",
        type=_argument(parse_workers),
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
    except Fatal as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # before serve's own handler is in place, or in another command
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
