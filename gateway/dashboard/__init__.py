"""The dashboard: server-rendered pages at / for people, beside the API.

Its session is a cookie (gateway.dashboard.sessions); the API stays bearer token and API key
only. Pages read through the API's own handler functions and data functions, never over HTTP.
One module per area, templates sharing templates/base.html, static files in static/ (no build
step, nothing from a CDN).
"""

from __future__ import annotations

import hashlib
import logging
import mimetypes
from importlib import resources
from typing import Any

import aiohttp_jinja2
import jinja2
from aiohttp import web
from markupsafe import escape

from gateway.dashboard import (
    account,
    alerts,
    analytics,
    filters,
    overview,
    servers,
    settings,
    tool_calls,
    tool_changes,
    toolsets,
)
from gateway.dashboard.pages import render, secure
from gateway.errors import ERROR_PAGE

log = logging.getLogger(__name__)

PAGE_MODULES = (
    account,
    overview,
    servers,
    tool_changes,
    toolsets,
    tool_calls,
    analytics,
    alerts,
    settings,
)

_TITLES = {
    400: "Bad request",
    403: "Not allowed",
    404: "Not found",
    405: "Not allowed",
    413: "Too large",
    422: "Not accepted",
    429: "Too many attempts",
    503: "Unavailable",
}


def setup_dashboard(app: web.Application) -> None:
    env = aiohttp_jinja2.setup(
        app,
        loader=jinja2.PackageLoader("gateway.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(filters.FILTERS)
    for module in PAGE_MODULES:
        app.router.add_routes(module.pages.routes)
    app.router.add_get("/static/{name}", _static_handler())
    app[ERROR_PAGE] = error_page


async def error_page(
    request: web.Request, status: int, detail: str, headers: dict[str, str] | None
) -> web.StreamResponse:
    """An error of a page, as a page (the API's errors stay JSON)."""
    context = {
        "status": status,
        "title": _TITLES.get(status, "Something went wrong"),
        "detail": detail,
    }
    try:
        response = await render(request, "error.html", context, status=status)
    except Exception:  # the database may be what failed: a page without the layout's data
        log.exception("could not render the error page for %s", request.path)
        response = web.Response(
            status=status,
            text=f"<!doctype html><title>{status}</title><p>{escape(detail)}</p>",
            content_type="text/html",
        )
        secure(response)
    response.headers.update(headers or {})
    return response


def _static_handler() -> Any:
    """The files of static/, read once: a name not among them is a 404."""
    folder = resources.files("gateway.dashboard").joinpath("static")
    files: dict[str, tuple[bytes, str, str]] = {}
    for entry in folder.iterdir():
        if entry.is_file():
            body = entry.read_bytes()
            kind = mimetypes.guess_type(entry.name)[0] or "application/octet-stream"
            files[entry.name] = (body, kind, hashlib.sha256(body).hexdigest()[:16])

    async def static(request: web.Request) -> web.StreamResponse:
        found = files.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound()
        body, kind, etag = found
        if request.headers.get("If-None-Match") == f'"{etag}"':
            response = web.Response(status=304)
        else:
            response = web.Response(body=body, content_type=kind)
        response.headers["ETag"] = f'"{etag}"'
        response.headers["Cache-Control"] = "public, max-age=300"
        secure(response)
        return response

    return static
