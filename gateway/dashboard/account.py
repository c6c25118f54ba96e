"""Signing up, logging in and out, accepting an invitation, switching workspaces, and the
account page: the address and its verification, pending invitations, the apps connected with
OAuth (and revoking one, here or from the workspace settings), the password."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from gateway.accounts import signup as accounts
from gateway.accounts.access import AUTHENTICATOR
from gateway.api import auth as auth_api
from gateway.api.auth import LoginIn, PasswordChangeIn, SignupIn, VerifyEmailIn
from gateway.dashboard import sessions
from gateway.dashboard.pages import (
    FormInvalid,
    Pages,
    api_errors,
    call,
    field_text,
    parse_uuid,
    path_id,
    redirect,
    render,
    safe_next,
    signed_in_user,
    validated,
)
from gateway.db import dashboard_sessions as sessions_db
from gateway.db import invites as invites_db
from gateway.db import oauth_grants as grants_db
from gateway.errors import ApiError, BadRequest, Forbidden, NotFound
from gateway.keys import POOL, SETTINGS
from gateway.security.tokens import InvalidToken, read_email_token

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
        await accounts.welcome(request, user)
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


# Notices the account page shows after a redirect: fixed texts, chosen by a word in the query.
_NOTICES = {
    "password": "Your password was changed. Every other session of your account was signed out.",
    "sent": "A confirmation link is on its way to your address. Open it while signed in here.",
    "verified": "Your email address is verified.",
}


@pages.get("/account", "account.html")
async def account_page(request: web.Request) -> dict[str, Any]:
    return await _account(request, notice=_NOTICES.get(request.query.get("done", ""), ""))


async def _account(
    request: web.Request,
    *,
    failed: str = "",
    errors: dict[str, str] | None = None,
    notice: str = "",
) -> dict[str, Any]:
    """The account page; `failed` names the form whose `errors` it shows."""
    # As GET /auth/me answers: the tokens of invitations only for a verified address.
    me = await call(request, auth_api.me)
    session = request[sessions.SESSION]
    grants = await grants_db.list_for_user(request.app[POOL], session.user_id)
    return {
        "section": "account",
        "me": me,
        "connected_apps": connected_apps(grants, session.workspace_id),
        "emails_sent": request.app[SETTINGS].smtp_url is not None,
        "failed": failed,
        "errors": errors or {},
        "notice": notice,
    }


async def _account_refused(
    request: web.Request, status: int, failed: str, exc: ApiError | FormInvalid
) -> web.StreamResponse:
    """The account page again, with why the form `failed` was refused."""
    errors = exc.errors if isinstance(exc, FormInvalid) else api_errors(exc)
    context = await _account(request, failed=failed, errors=errors)
    response = await render(request, "account.html", context, status=status)
    if isinstance(exc, ApiError):
        response.headers.update(exc.headers)  # Retry-After
    return response


def connected_apps(
    grants: list[dict[str, Any]], workspace_id: uuid.UUID | None
) -> list[dict[str, Any]]:
    """Grants as "Connected apps" lists them: what each opens (a server or a toolset, with a
    link to its page when it is in the workspace the dashboard shows, whose pages those are)."""
    for grant in grants:
        kind = "server" if grant["server_id"] is not None else "toolset"
        grant["kind"] = kind
        target = grant["server_id"] or grant["toolset_id"]
        here = grant["workspace_id"] == workspace_id
        grant["link"] = f"/{kind}s/{target}" if here else None
        # A client known by its metadata document is named by that document's address too.
        client_id = grant["client_id"]
        grant["client_url"] = client_id if client_id.startswith("https://") else ""
    return grants


@pages.post("/connected-apps/{grant_id}/revoke")
async def revoke_connected_app(request: web.Request) -> web.StreamResponse:
    """Its member revokes a grant, or an admin or owner of its workspace does; anyone else
    finds nothing there. The app's tokens stop working at once, in every process."""
    grant_id = path_id(request, "grant_id", "connected app")
    user_id = request[sessions.SESSION].user_id
    if not await grants_db.delete(request.app[POOL], grant_id, user_id):
        raise NotFound("connected app not found")
    # At once here; other processes drop it when the trigger's NOTIFY reaches them.
    request.app[AUTHENTICATOR].grants.forget(grant_id)
    return redirect(safe_next(field_text(request, "next") or "/account#connected-apps"))


@pages.post("/account/password")
async def change_password(request: web.Request) -> web.StreamResponse:
    """Every session of the account ends (this browser's too, which gets a new one)."""
    user = await signed_in_user(request)
    values = {name: field_text(request, name) for name in ("current_password", "new_password")}
    try:
        if values["new_password"] != field_text(request, "new_password_again"):
            raise FormInvalid({"new_password_again": "does not match the new password"})
        body = validated(PasswordChangeIn, values)
        stored, new_hash = await accounts.check_password_change(
            request, user, body.current_password, body.new_password
        )
        async with request.app[POOL].acquire() as conn, conn.transaction():
            await accounts.change_password(conn, user, stored, new_hash)
    except FormInvalid as exc:
        return await _account_refused(request, 422, "password", exc)
    except ApiError as exc:  # a wrong current password (403), too many attempts (429)
        if exc.status not in (403, 429):
            raise
        return await _account_refused(request, exc.status, "password", exc)
    workspace_id = request[sessions.SESSION].workspace_id
    return await _signed_in_at(request, user.id, workspace_id, "/account?done=password")


@pages.post("/account/verify-email")
async def send_verification(request: web.Request) -> web.StreamResponse:
    try:
        await call(request, auth_api.send_verification)
    except ApiError as exc:  # no email on this gateway, already verified (400), too many (429)
        if exc.status not in (400, 429):
            raise
        return await _account_refused(request, exc.status, "verify", exc)
    return redirect("/account?done=sent")


@pages.get("/verify-email/{token}", "verify_email.html")
async def verify_email_page(request: web.Request) -> dict[str, Any]:
    """The link of a verification email: signed in as the account it was sent for (the page
    asks to log in first), a button confirms the address."""
    token = request.match_info["token"]
    try:
        claims = read_email_token(request.app[SETTINGS].jwt_secret, token)
    except InvalidToken as exc:
        raise BadRequest(str(exc)) from None
    if claims.user_id != request[sessions.SESSION].user_id:
        raise Forbidden(
            "this link confirms the address of another account: log out, and sign in as the "
            "account it was sent for"
        )
    return {"section": "account", "email": claims.email, "token": token}


@pages.post("/verify-email/{token}")
async def verify_email(request: web.Request) -> web.StreamResponse:
    body = VerifyEmailIn(token=request.match_info["token"])
    await call(request, auth_api.verify_email, body=body)
    return redirect("/account?done=verified")


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
