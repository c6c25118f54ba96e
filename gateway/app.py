"""create_app(settings): the whole application, assembled in dependency order."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from importlib.metadata import PackageNotFoundError, version

import aiohttp
import asyncpg
from aiohttp import web

from gateway.accounts.access import AUTHENTICATOR, Authenticator
from gateway.accounts.mailer import MAILER, Mailer
from gateway.accounts.ratelimit import EMAIL_RATE_LIMITER, RATE_LIMITER, AuthRateLimiter
from gateway.accounts.signup import VERIFICATION_EMAIL_RATE
from gateway.api import alerts as alerts_api
from gateway.api import analytics as analytics_api
from gateway.api import auth as auth_api
from gateway.api import health as health_api
from gateway.api import metrics as metrics_api
from gateway.api import openapi
from gateway.api import servers as servers_api
from gateway.api import tool_calls as tool_calls_api
from gateway.api import tool_integrity as tool_integrity_api
from gateway.api import tools as tools_api
from gateway.api import toolsets as toolsets_api
from gateway.api import workspaces as workspaces_api
from gateway.api.discovery import setup_discovery
from gateway.api.openapi import OPENAPI_DOCUMENT
from gateway.api.routing import API_PREFIX, ENDPOINTS, mount
from gateway.background import (
    alert_evaluator,
    last_used,
    notifier,
    prober,
    retention,
)
from gateway.background.notifier import ALERTS_QUEUED
from gateway.background.tasks import BackgroundTasks, Loop
from gateway.caching import listener as cache_listener
from gateway.caching.caches import CACHES, Caches
from gateway.caching.shared import SHARED_CACHE, create_shared_cache
from gateway.calllog.writer import CALL_LOG, CallLog
from gateway.config import Settings
from gateway.dashboard import setup_dashboard
from gateway.db.pool import create_pool
from gateway.db.schema import apply_schema
from gateway.errors import error_middleware
from gateway.keys import HTTP, POOL, SETTINGS
from gateway.mcp.tool_list_budget import ToolListMemory
from gateway.oauth import oauth_enabled
from gateway.oauth.endpoints import oauth_context, setup_oauth
from gateway.ops import snapshots, tracing
from gateway.ops.metrics import METRICS, Metrics
from gateway.ops.readiness import setup_readiness
from gateway.policy.budgets import BUDGETS, budgets_for
from gateway.proxy import handler as proxy
from gateway.proxy.tasks import task_follower_context
from gateway.security.secretbox import SECRET_BOX, SecretBox
from gateway.security.untrusted_schemas import SCHEMA_CHECKER, SchemaChecker
from gateway.toolsets import endpoint as toolset_endpoint
from gateway.toolsets.endpoint import ToolsetEndpoint
from gateway.toolsets.registry import TOOLSETS, Toolsets
from gateway.upstreams.fingerprints import tool_watch_context
from gateway.upstreams.servers import UPSTREAMS, Upstreams
from gateway.upstreams.tool_lists import TOOL_LIST_MEMORY, TOOL_LISTS, ToolLists

log = logging.getLogger(__name__)

_LISTENER_WAIT_SECONDS = 5.0

# The loops that only processes with GATEWAY_RUN_WORKERS run (tests drive them by hand).
WORKER_LOOPS: tuple[tuple[str, Loop], ...] = (
    ("prober", prober.run),
    ("retention", retention.run),
    ("alert-evaluator", alert_evaluator.run),
    ("alert-notifier", notifier.run),
)

API_MODULES = (
    openapi.routes,
    auth_api.routes,
    workspaces_api.routes,
    proxy.routes,
    toolset_endpoint.routes,
    tool_calls_api.routes,
    servers_api.routes,
    tool_integrity_api.routes,
    tools_api.routes,
    toolsets_api.routes,
    health_api.routes,
    analytics_api.routes,
    alerts_api.routes,
    metrics_api.routes,
)


def service_version() -> str:
    try:
        return version("mcp-gateway")
    except PackageNotFoundError:
        return "0.0.0"


async def _database(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    assert settings.database_url is not None, "create_app needs settings.database_url"
    # On a connection of its own: a migration may run longer than any request may wait.
    conn = await asyncpg.connect(settings.database_url)
    try:
        await apply_schema(conn, tool_call_retention_days=settings.tool_call_retention_days)
    finally:
        await conn.close()
    pool = await create_pool(
        settings.database_url,
        acquire_timeout=settings.db_acquire_timeout_seconds,
        statement_timeout=settings.db_statement_timeout_seconds,
        on_wait=app[METRICS].pool_wait_seconds.observe,
    )
    app[POOL] = pool
    # Counts shared by every process: in PostgreSQL, or in Redis when there is one.
    app[RATE_LIMITER] = AuthRateLimiter.shared(settings.auth_rate_limit, pool, settings.redis_url)
    app[EMAIL_RATE_LIMITER] = AuthRateLimiter.shared(
        VERIFICATION_EMAIL_RATE, pool, settings.redis_url
    )
    oauth_base = settings.base_url if oauth_enabled(settings) else None
    app[AUTHENTICATOR] = Authenticator(pool, settings.jwt_secret, app[CACHES], oauth_base)
    app[UPSTREAMS] = Upstreams(pool, app[SECRET_BOX], app[CACHES])
    app[TOOLSETS] = Toolsets(
        pool, app[CACHES], app[UPSTREAMS], index_seconds=settings.tools_cache_seconds
    )
    yield
    await pool.close()


async def _budgets(app: web.Application) -> AsyncIterator[None]:
    # Every process takes leases of rate limits' budgets (and gives them back on the way out).
    settings = app[SETTINGS]
    async with budgets_for(app[POOL], settings.redis_url) as budgets:
        app[BUDGETS] = budgets
        yield


async def _call_log(app: web.Application) -> AsyncIterator[None]:
    # After the pool and before the HTTP client: on shutdown it drains before the pool closes.
    settings = app[SETTINGS]
    # A POST /tool-calls waits for its commit as long as a statement may take, no longer.
    commit_timeout = settings.db_acquire_timeout_seconds + settings.db_statement_timeout_seconds
    call_log = CallLog(app[POOL], commit_timeout=commit_timeout)
    app[CALL_LOG] = call_log
    call_log.start()
    yield
    await call_log.close()


async def _http_client(app: web.Application) -> AsyncIterator[None]:
    # No total timeout: long SSE streams are legitimate. Each use bounds connect and reads.
    session = aiohttp.ClientSession(
        auto_decompress=False,
        # Shared by every tenant: a cookie one upstream sets must never reach another request.
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        connector=aiohttp.TCPConnector(
            limit=0,
            limit_per_host=0,
            ttl_dns_cache=300,
            # Every address dialled is checked against the outbound policy, after resolution.
            socket_factory=app[SETTINGS].outbound.socket_factory(),
        ),
    )
    app[HTTP] = session
    yield
    await session.close()


async def _shared_cache(app: web.Application) -> AsyncIterator[None]:
    cache = create_shared_cache(app[SETTINGS].redis_url)
    app[SHARED_CACHE] = cache
    # Before the background tasks: registered with CACHES before the listener starts.
    app[TOOL_LISTS] = ToolLists.from_app(app)
    yield
    await app[TOOL_LISTS].close()
    await cache.close()


async def _schema_checker(app: web.Application) -> AsyncIterator[None]:
    # Its worker processes start when first needed, and are killed (by PID) here.
    checker = SchemaChecker(seconds=app[SETTINGS].schema_check_seconds)
    app[SCHEMA_CHECKER] = checker
    yield
    await checker.close()


async def _background_tasks(app: web.Application) -> AsyncIterator[None]:
    # Started last and stopped first, so they never outlive the pool or the HTTP client.
    tasks = BackgroundTasks(app)
    tasks.start("cache-listener", cache_listener.run)
    # Until the listener is in, nothing is cached: wait for it briefly (a database that is
    # not there is not waited for; the listener keeps trying).
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(app[CACHES].listening.wait(), _LISTENER_WAIT_SECONDS)
    tasks.start("last-used", last_used.run)
    if app[SETTINGS].run_workers:
        for name, loop in WORKER_LOOPS:
            tasks.start(name, loop)
    yield
    await tasks.stop()
    await app[MAILER].close()


# The routes whose requests are traced as SERVER spans (gateway.ops.tracing), when it is on.
_TRACED_ROUTES = {
    API_PREFIX + proxy.PROXY_PATH: tracing.MCP_ENDPOINT,
    API_PREFIX + toolset_endpoint.TOOLSET_PATH: tracing.MCP_ENDPOINT,
    API_PREFIX + tools_api.INVOKE_PATH: tracing.PLAYGROUND,
    # The dashboard's playground form posts to the same path without the prefix.
    tools_api.INVOKE_PATH: tracing.PLAYGROUND,
}


def create_app(settings: Settings) -> web.Application:
    traces = tracing.Tracing(service_version()) if settings.tracing else None
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        # Authentication happens per route (gateway.api.routing), inside these middlewares.
        # Tracing is outermost, to see the answers the error middleware makes; off, it is not
        # there at all.
        middlewares=[
            *([tracing.middleware(traces, _TRACED_ROUTES)] if traces is not None else []),
            error_middleware,
        ],
    )
    app[SETTINGS] = settings
    app[METRICS] = Metrics(per_server=settings.metrics_per_server)
    app[tracing.TRACING] = traces
    if traces is not None:
        app[METRICS].readings.extend(traces.readings())
        app.on_cleanup.append(lambda app: traces.close())
    app[CACHES] = Caches()
    app[ALERTS_QUEUED] = asyncio.Event()
    app[TOOL_LIST_MEMORY] = ToolListMemory()
    app[SECRET_BOX] = SecretBox(settings.secret_keys)
    app[MAILER] = Mailer(settings.smtp_url)
    endpoints = mount(app, API_MODULES)
    app[ENDPOINTS] = endpoints
    app[OPENAPI_DOCUMENT] = openapi.build_document(endpoints, service_version())
    openapi.add_docs_static(app)
    setup_discovery(app)
    setup_dashboard(app)
    setup_oauth(app)
    setup_readiness(app)
    app.cleanup_ctx.extend(
        [
            _database,
            _budgets,
            _call_log,
            tool_watch_context,
            task_follower_context,
            snapshots.metrics_context,
            _http_client,
            oauth_context,
            _shared_cache,
            _schema_checker,
            _background_tasks,
        ]
    )
    # After the cleanup contexts' own start (aiohttp runs them first), which make its parts.
    app.on_startup.append(proxy.Proxying.setup)
    app.on_startup.append(
        functools.partial(ToolsetEndpoint.setup, server_version=service_version())
    )
    return app
