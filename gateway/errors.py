"""API errors and the one middleware that renders every failure as {"detail": ...}."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import asyncpg
import orjson
from aiohttp import web

from gateway.db.unavailable import DATABASE_DOWN
from gateway.proxy import cors

log = logging.getLogger(__name__)


class ApiError(Exception):
    status = 500

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}


class BadRequest(ApiError):
    status = 400


class Unauthorized(ApiError):
    status = 401


class Forbidden(ApiError):
    status = 403


class NotFound(ApiError):
    status = 404


class RequestTimeout(ApiError):
    status = 408


class PayloadTooLarge(ApiError):
    status = 413


class UnsupportedMediaType(ApiError):
    status = 415


class ValidationFailed(ApiError):
    status = 422


class BoundReached(ValidationFailed):
    """A workspace (or user) holds as many of something as this gateway allows: 422, saying
    what it holds, the setting that bounds it, and what to do."""

    def __init__(self, holding: str, setting: str, remedy: str) -> None:
        super().__init__(f"{holding}, the most this gateway allows ({setting}): {remedy}")


class TooManyRequests(ApiError):
    status = 429

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after)})


class JsonRpcRefusal(ApiError):
    """An MCP request the gateway refuses itself, answered as a JSON-RPC error response (an
    MCP client reads it as it would its server's) instead of {"detail": ...}."""

    def __init__(
        self,
        status: int,
        code: int,
        message: str,
        request_id: str | int | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, headers=headers)
        self.status = status
        self.body = orjson.dumps(
            {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
        )


class BadGateway(ApiError):
    status = 502


class ServiceUnavailable(ApiError):
    status = 503


class GatewayTimeout(ApiError):
    status = 504


# Unique constraints a client can trip; their names come from schema.sql.
DUPLICATES = {
    "users_email_key": "a user with this email already exists",
    "workspaces_slug_key": "a workspace with this slug already exists",
    "servers_workspace_id_name_key": "a server with this name already exists in this workspace",
    "toolsets_workspace_id_name_key": "a toolset with this name already exists in this workspace",
}

# aiohttp's own reasons are terse; these read better in {"detail": ...}.
_HTTP_DETAILS = {
    404: "not found",
    405: "method not allowed",
    413: "request body too large",
}


def json_error(status: int, detail: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps({"detail": detail}),
        content_type="application/json",
        headers=headers,
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _error(
    request: web.Request, status: int, detail: str, headers: dict[str, str] | None = None
) -> web.StreamResponse:
    headers = cors.error_headers(request, headers)
    # The API (and the proxy) answer JSON; the dashboard's pages answer pages.
    page = None if request.path.startswith("/api/") else request.app.get(ERROR_PAGE)
    if page is not None:
        return await page(request, status, detail, headers)
    return json_error(status, detail, headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except JsonRpcRefusal as exc:
        return web.Response(
            status=exc.status,
            body=exc.body,
            content_type="application/json",
            headers=cors.error_headers(request, exc.headers),
        )
    except ApiError as exc:
        return await _error(request, exc.status, exc.detail, exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
        detail = _HTTP_DETAILS.get(exc.status, exc.reason.lower())
        return await _error(request, exc.status, detail, headers)
    except asyncpg.UniqueViolationError as exc:
        duplicate = DUPLICATES.get(exc.constraint_name or "")
        if duplicate is None:
            log.exception("unexpected unique violation on %s %s", request.method, request.path)
            return await _error(request, 500, "internal server error")
        return await _error(request, 400, duplicate)
    except DATABASE_DOWN as exc:
        # The database is briefly unreachable (restart, failover): tell clients to retry.
        log.warning("database unavailable on %s %s: %s", request.method, request.path, exc)
        return await _error(
            request, 503, "database unavailable, retry shortly", {"Retry-After": "1"}
        )
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return await _error(request, 500, "internal server error")


# Renders an error of a dashboard page (anything outside /api/) as a page: (request, status,
# detail, headers). Without it every error is JSON.
ERROR_PAGE: web.AppKey[
    Callable[[web.Request, int, str, dict[str, str] | None], Awaitable[web.StreamResponse]]
] = web.AppKey("error_page")
