"""Signing up, logging in and out, accepting an invitation, switching and creating workspaces."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway import accounts
from gateway.api.auth import LoginIn, SignupIn
from gateway.dashboard import sessions
from gateway.dashboard.pages import (
    FormInvalid,
    Pages,
    api_errors,
    field_text,
    parse_uuid,
    redirect,
    render,
    safe_next,
    signed_in_user,
    validated,
)
from gateway.db import dashboard_sessions as sessions_db
from gateway.db import invites as invites_db
from gateway.errors import ApiError, NotFound
from gateway.keys import AUTHENTICATOR, POOL

pages = Pages()


def _signed_in(request: web.Request) -> bool:
    return request.get(sessions.SESSION) is not None


@pages.get("/login", "login.html", signed_in=False)
async def login_page(request: web.Request) -> dict[str, Any] | web.StreamResponse:
    next_page = safe_next(request.query.get("next"))
    if _signed_in(request):
        return redirect(next_page)
    return {"next": next_page, "email": "", "errors": {}}


@pages.post("/login", signed_in=False)
async def login(request: web.Request) -> web.StreamResponse:
    next_page = safe_next(field_text(request, "next"))
    email = field_text(request, "email")
    try:
        body = validated(LoginIn, {"email": email, "password": field_text(request, "password")})
        user = await accounts.log_in(request, body.email, body.password)
    except FormInvalid as exc:
        return await _form(
            request,
            "login.html",
            exc.errors,
            422,
            next=next_page,
            email=email,
        )
    except ApiError as exc:  # wrong password (401), too many attempts (429)
        return await _form(
            request,
            "login.html",
            {"": exc.detail},
            exc.status,
            exc.headers,
            next=next_page,
            email=email,
        )
    async with request.app[POOL].acquire() as conn, conn.transaction():
        workspace = await accounts.home_workspace(conn, user)
    return await _signed_in_at(request, user.id, workspace["id"], next_page)


@pages.get("/signup", "signup.html", signed_in=False)
async def signup_page(request: web.Request) -> dict[str, Any] | web.StreamResponse:
    if _signed_in(request):
        return redirect("/")
    token = request.query.get("invite")
    invite = await _invite(request, token)
    return {
        "values": {"email": invite["email"] if invite else "", "name": ""},
        "invite": invite,
        "invite_token": token if invite else "",
        "errors": {},
        "refusal": accounts.signup_refusal(request, token if invite else None),
    }


@pages.post("/signup", signed_in=False)
async def signup(request: web.Request) -> web.StreamResponse:
    values = {name: field_text(request, name) for name in ("email", "name", "password")}
    token = field_text(request, "invite_token") or None
    invite = await _invite(request, token)
    try:
        body = validated(SignupIn, {**values, "invite_token": token})
        password_hash = await accounts.admit(request, body.email, body.password, token)
        async with request.app[POOL].acquire() as conn, conn.transaction():
            user, workspace = await accounts.sign_up(
                conn, body.email, body.name, password_hash, token
            )
    except FormInvalid as exc:
        return await _form(
            request,
            "signup.html",
            exc.errors,
            422,
            values=values,
            invite=invite,
            invite_token=token,
            refusal=None,
        )
    except ApiError as exc:  # email taken (400), invitation gone (404), rate limit (429)
        return await _form(
            request,
            "signup.html",
            api_errors(exc),
            exc.status,
            exc.headers,
            values=values,
            invite=invite,
            invite_token=token,
            refusal=None,
        )
    return await _signed_in_at(request, user.id, workspace["id"], "/")


@pages.post("/logout")
async def logout(request: web.Request) -> web.StreamResponse:
    response = redirect("/login")
    await sessions.end(request, response)
    return response


@pages.get("/invite/{token}", "invite.html", signed_in=False)
async def invite_page(request: web.Request) -> dict[str, Any]:
    """The link an invitation email carries: accept it signed in, or sign up / log in first."""
    token = request.match_info["token"]
    invite = await _invite(request, token)
    if invite is None:
        raise NotFound("this invitation was not found, has expired or was already used")
    return {"invite": invite, "token": token}


@pages.post("/invite/{token}")
async def accept_invite(request: web.Request) -> web.StreamResponse:
    user = await signed_in_user(request)
    async with request.app[POOL].acquire() as conn, conn.transaction():
        workspace = await accounts.accept_invitation(
            request, conn, user, request.match_info["token"]
        )
    accounts.forget_membership(request, workspace, user)
    await sessions_db.switch(request.app[POOL], request[sessions.SESSION].id_hash, workspace["id"])
    return redirect("/")


@pages.post("/switch")
async def switch_workspace(request: web.Request) -> web.StreamResponse:
    session = request[sessions.SESSION]
    workspace_id = parse_uuid(field_text(request, "workspace_id"))
    role = None
    if workspace_id is not None:
        role = await request.app[AUTHENTICATOR].role(workspace_id, session.user_id)
    if workspace_id is None or role is None:
        raise NotFound("workspace not found")
    await sessions_db.switch(request.app[POOL], session.id_hash, workspace_id)
    return redirect(safe_next(field_text(request, "next")))


async def _invite(request: web.Request, token: str | None) -> dict[str, Any] | None:
    if not token:
        return None
    return await invites_db.pending_by_token(request.app[POOL], token)


async def _form(
    request: web.Request,
    template: str,
    errors: dict[str, str],
    status: int,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> web.StreamResponse:
    response = await render(request, template, {"errors": errors, **context}, status=status)
    response.headers.update(headers or {})
    return response


async def _signed_in_at(
    request: web.Request, user_id: Any, workspace_id: Any, next_page: str
) -> web.StreamResponse:
    response = redirect(next_page)
    # A sign-in replaces whatever session this browser had (a fresh id, the old one ended).
    await sessions.end(request, response)
    await sessions.start(request, response, user_id, workspace_id)
    sessions.drop_form_cookie(request, response)
    return response
