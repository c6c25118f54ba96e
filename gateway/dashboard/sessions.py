"""Dashboard sign-ins: a session cookie, and a CSRF token for every form.

The cookie holds a random id; PostgreSQL holds only its hash, so logging out ends the session
in every gateway process at once. Forms carry a token derived from the session (or, before
signing in, from a random cookie of its own) with an HMAC under the JWT secret: a page of
another site can neither read it nor make one up.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from datetime import timedelta

from aiohttp import web

from gateway.db import dashboard_sessions as sessions_db
from gateway.db.dashboard_sessions import DashboardSession
from gateway.keys import POOL, SETTINGS
from gateway.security.tokens import hash_token

SESSION_COOKIE = "mcpg_session"
# Before signing in: what the login and signup forms' tokens are derived from.
FORM_COOKIE = "mcpg_form"
# Over https both carry the __Host- prefix: the browser then keeps them Secure, for this host
# and path / only, so no sibling subdomain can plant one (a planted form cookie would let
# another site sign a browser into its own account).
_HOST_PREFIX = "__Host-"
CSRF_FIELD = "csrf_token"
LIFETIME = timedelta(days=7)

SESSION = web.RequestKey("dashboard_session", DashboardSession)


def _idle(request: web.Request) -> timedelta:
    return timedelta(hours=request.app[SETTINGS].dashboard_session_hours)


def _secure(request: web.Request) -> bool:
    return request.app[SETTINGS].base_url.startswith("https://")


def cookie_name(request: web.Request, name: str) -> str:
    return _HOST_PREFIX + name if _secure(request) else name


def _cookie(request: web.Request, name: str) -> str | None:
    return request.cookies.get(cookie_name(request, name))


def _set_cookie(request: web.Request, response: web.StreamResponse, name: str, value: str) -> None:
    response.set_cookie(
        cookie_name(request, name),
        value,
        max_age=int(LIFETIME.total_seconds()),
        path="/",
        httponly=True,
        samesite="Lax",
        secure=_secure(request),
    )


async def current(request: web.Request) -> DashboardSession | None:
    raw = _cookie(request, SESSION_COOKIE)
    if not raw:
        return None
    return await sessions_db.find(request.app[POOL], hash_token(raw), _idle(request), LIFETIME)


async def start(
    request: web.Request, response: web.StreamResponse, user_id: uuid.UUID, workspace_id: uuid.UUID
) -> None:
    """Open a session for the user (a new id: one from before signing in is never reused)."""
    raw = secrets.token_urlsafe(32)
    await sessions_db.open_session(
        request.app[POOL], hash_token(raw), user_id, workspace_id, _idle(request)
    )
    _set_cookie(request, response, SESSION_COOKIE, raw)


async def end(request: web.Request, response: web.StreamResponse) -> None:
    raw = _cookie(request, SESSION_COOKIE)
    if raw:
        await sessions_db.end(request.app[POOL], hash_token(raw))
    response.del_cookie(cookie_name(request, SESSION_COOKIE), path="/")


# Signed out: the value of the form cookie this request's tokens derive from.
_FORM_VALUE = web.RequestKey("dashboard_form_value", str)


def _sign(request: web.Request, material: str) -> str:
    key = request.app[SETTINGS].jwt_secret.encode()
    return hmac.new(key, f"dashboard-csrf:{material}".encode(), hashlib.sha256).hexdigest()


def csrf_token(request: web.Request) -> str:
    """The token every form of this page carries."""
    session = request.get(SESSION)
    if session is not None:
        return _sign(request, f"session:{session.id_hash}")
    if _FORM_VALUE not in request:
        request[_FORM_VALUE] = _cookie(request, FORM_COOKIE) or secrets.token_urlsafe(24)
    return _sign(request, f"form:{request[_FORM_VALUE]}")


def drop_form_cookie(request: web.Request, response: web.StreamResponse) -> None:
    """Signed in, the forms' tokens come from the session: the form cookie has done its job."""
    response.del_cookie(cookie_name(request, FORM_COOKIE), path="/")


def keep_form_cookie(request: web.Request, response: web.StreamResponse) -> None:
    """Signed out, after a page rendered tokens from a new form cookie value: send it."""
    value = request.get(_FORM_VALUE)
    if value is not None and _cookie(request, FORM_COOKIE) != value:
        _set_cookie(request, response, FORM_COOKIE, value)


def valid_csrf(request: web.Request, sent: str | None) -> bool:
    return bool(sent) and hmac.compare_digest(sent or "", csrf_token(request))
