"""Every web.AppKey of the application, so shared state is typed and found in one place."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import asyncpg
from aiocache.base import BaseCache
from aiohttp import web

from gateway.config import Settings

if TYPE_CHECKING:
    from gateway.accounts.access import Authenticator
    from gateway.accounts.mailer import Mailer
    from gateway.accounts.ratelimit import AuthRateLimiter
    from gateway.api.routing import Endpoint
    from gateway.caching.caches import Caches
    from gateway.calllog.writer import CallLog
    from gateway.mcp.client import ToolListMemory
    from gateway.ops.metrics import Metrics
    from gateway.ops.readiness import DatabaseCheck
    from gateway.proxy.handler import Proxying
    from gateway.security.secretbox import SecretBox
    from gateway.security.untrusted_schemas import SchemaChecker
    from gateway.upstreams.servers import Upstreams
    from gateway.upstreams.tool_lists import ToolLists

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", asyncpg.Pool)
# The one client session for every upstream request (proxy, probes, playground, webhooks).
HTTP = web.AppKey("http", aiohttp.ClientSession)
CACHES: web.AppKey[Caches] = web.AppKey("caches")
AUTHENTICATOR: web.AppKey[Authenticator] = web.AppKey("authenticator")
RATE_LIMITER: web.AppKey[AuthRateLimiter] = web.AppKey("auth_rate_limiter")
# Verification emails per address (gateway.accounts.signup), shared by every process likewise.
EMAIL_RATE_LIMITER: web.AppKey[AuthRateLimiter] = web.AppKey("email_rate_limiter")
SECRET_BOX: web.AppKey[SecretBox] = web.AppKey("secret_box")
MAILER: web.AppKey[Mailer] = web.AppKey("mailer")
UPSTREAMS: web.AppKey[Upstreams] = web.AppKey("upstreams")
# The tool call log: add() from the hot path, write() to wait for the commit.
CALL_LOG: web.AppKey[CallLog] = web.AppKey("call_log")
# Tool lists and analytics answers: in memory, or in Redis shared by every process.
SHARED_CACHE = web.AppKey("shared_cache", BaseCache)
# The playground's upstream tool lists (kept in SHARED_CACHE).
TOOL_LISTS: web.AppKey[ToolLists] = web.AppKey("tool_lists")
# What this process holds of upstream tool lists at once (playground and probes alike).
TOOL_LIST_MEMORY: web.AppKey[ToolListMemory] = web.AppKey("tool_list_memory")
# The worker processes that check playground arguments against upstream JSON Schemas.
SCHEMA_CHECKER: web.AppKey[SchemaChecker] = web.AppKey("schema_checker")
ENDPOINTS: web.AppKey[list[Endpoint]] = web.AppKey("endpoints")
# Each API handler function's endpoint: its access rules, for the dashboard's calls.
ENDPOINT_OF: web.AppKey[dict[Callable[..., Any], Endpoint]] = web.AppKey("endpoint_of")
OPENAPI_DOCUMENT: web.AppKey[dict[str, Any]] = web.AppKey("openapi_document")
# Renders an error of a dashboard page (anything outside /api/) as a page: (request, status,
# detail, headers). Without it every error is JSON.
ERROR_PAGE: web.AppKey[
    Callable[[web.Request, int, str, dict[str, str] | None], Awaitable[web.StreamResponse]]
] = web.AppKey("error_page")
# /readyz's check of PostgreSQL (one at a time, however often it is polled).
DATABASE_CHECK: web.AppKey[DatabaseCheck] = web.AppKey("database_check")
# What this process counts, for /metrics (the hot paths hold their instruments directly).
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
# What the proxy uses on every request (set once the cleanup contexts have run).
PROXYING: web.AppKey[Proxying] = web.AppKey("proxying")
