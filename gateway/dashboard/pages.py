"""Declaring dashboard pages: who may see them, their template, CSRF on every POST, and calls
into the API's own handler functions under the same role rules as the API.

A page is `async def view(request) -> dict | web.StreamResponse`: a dict is the context of
its template. Pages never call the API over HTTP; `call(request, api_handler, ...)` runs the
handler function itself after checking the role its route declares (gateway.api.routing).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import aiohttp_jinja2
import pydantic
from aiohttp import web
from multidict import MultiDictProxy
from yarl import URL

from gateway.accounts import signup as accounts
from gateway.accounts.access import AUTHENTICATOR, PRINCIPAL, Role
from gateway.api.routing import ENDPOINT_OF, read_bytes
from gateway.dashboard import sessions
from gateway.db import dashboard_sessions as sessions_db
from gateway.db import users as users_db
from gateway.db import workspaces as workspaces_db
from gateway.db.users import User
from gateway.errors import ApiError, BadRequest, Forbidden, NotFound
from gateway.keys import POOL, SETTINGS

View = Callable[[web.Request], Awaitable[dict[str, Any] | web.StreamResponse]]
T = TypeVar("T")

FORM = web.RequestKey("dashboard_form", MultiDictProxy[Any])
# The signed-in user's role in the workspace the pages show.
ROLE = web.RequestKey("dashboard_role", Role)

# Every dashboard response: no inline script or style, no framing, no sniffing.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}


@dataclass
class Pages:
    """The pages of one dashboard module, mounted by gateway.dashboard."""

    routes: web.RouteTableDef = field(default_factory=web.RouteTableDef)

    def get(
        self, path: str, template: str | None = None, *, signed_in: bool = True
    ) -> Callable[[View], View]:
        return self._add("GET", path, template, signed_in)

    def post(
        self, path: str, template: str | None = None, *, signed_in: bool = True
    ) -> Callable[[View], View]:
        return self._add("POST", path, template, signed_in)

    def _add(
        self, method: str, path: str, template: str | None, signed_in: bool
    ) -> Callable[[View], View]:
        def decorate(view: View) -> View:
            self.routes.route(method, path)(_wrap(view, template, signed_in))
            return view

        return decorate


def _wrap(
    view: View, template: str | None, signed_in: bool
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    @functools.wraps(view)
    async def handle(request: web.Request) -> web.StreamResponse:
        session = await sessions.current(request)
        if session is not None:
            request[sessions.SESSION] = await _in_workspace(request, session)
        elif signed_in:
            return redirect(login_url(request))
        if request.method == "POST":
            await read_bytes(request)  # within the body timeout; post() then parses it
            try:
                form = await request.post()
            except (UnicodeDecodeError, ValueError):  # not UTF-8, a broken multipart body
                raise BadRequest("this form could not be read: send it from its page") from None
            request[FORM] = form
            if not sessions.valid_csrf(request, _text(form.get(sessions.CSRF_FIELD))):
                raise Forbidden(
                    "this form has expired or did not come from this site: reload the page "
                    "and send it again"
                )
        result = await view(request)
        if isinstance(result, web.StreamResponse):
            response = result
        else:
            assert template is not None, f"{view.__name__} returns a context but has no template"
            response = await render(request, template, result)
        sessions.keep_form_cookie(request, response)
        return response

    return handle


async def render(
    request: web.Request, template: str, context: Mapping[str, Any], status: int = 200
) -> web.Response:
    response = aiohttp_jinja2.render_template(
        template, request, {**await _common(request), **context}, status=status
    )
    secure(response)
    # Pages show a tenant's data: never kept by a shared cache or the back button's.
    response.headers["Cache-Control"] = "no-store"
    return response


def secure(response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)


async def _in_workspace(request: web.Request, session: Any) -> Any:
    """The session as the pages use it: its workspace one the user still belongs to (else
    their home workspace, remembered), their role there in ROLE."""
    authenticator = request.app[AUTHENTICATOR]
    role = None
    if session.workspace_id is not None:
        role = await authenticator.role(session.workspace_id, session.user_id)
    if role is None:
        user = User(session.user_id, session.email, session.name)
        async with request.app[POOL].acquire() as conn, conn.transaction():
            home = await accounts.home_workspace(conn, user)
        await sessions_db.switch(request.app[POOL], session.id_hash, home["id"])
        session = sessions_db.DashboardSession(
            session.id_hash, session.user_id, session.email, session.name, home["id"]
        )
        role = Role(home["role"])
    request[ROLE] = role
    return session


async def _common(request: web.Request) -> dict[str, Any]:
    session = request.get(sessions.SESSION)
    context: dict[str, Any] = {
        "csrf_token": sessions.csrf_token(request),
        "path": request.path,
        "signup_open": request.app[SETTINGS].signup == "open",
        "section": "",
        "user": None,
        "workspaces": [],
        "workspace": None,
        "role": None,
        "can_admin": False,
        "is_owner": False,
    }
    if session is None:
        return context
    workspaces = await workspaces_db.list_for_user(request.app[POOL], session.user_id)
    role = request[ROLE]
    context.update(
        user=session,
        workspaces=workspaces,
        workspace=next((w for w in workspaces if w["id"] == session.workspace_id), None),
        role=role,
        can_admin=role.rank >= Role.ADMIN.rank,
        is_owner=role is Role.OWNER,
    )
    return context


async def authorize(
    request: web.Request, handler: Callable[..., Awaitable[Any]], **kwargs: Any
) -> None:
    """The role check of an API handler's route, without running it: a form page is refused
    as its action would be, and a POST refused before its values are judged (a member learns
    nothing about what the form would accept)."""
    access = request.app[ENDPOINT_OF][handler].access
    session = request[sessions.SESSION]
    workspace_id = kwargs["workspace_id"] if access.path_workspace else session.workspace_id
    assert workspace_id is not None  # set by _in_workspace for every signed-in page
    request[PRINCIPAL] = await request.app[AUTHENTICATOR].authorize(
        session.user_id, workspace_id, access
    )


async def call(request: web.Request, handler: Callable[..., Awaitable[T]], **kwargs: Any) -> T:
    """Run an API handler function for the signed-in user, after the role check its route
    declares: a member is refused an admin's action here exactly as over HTTP."""
    await authorize(request, handler, **kwargs)
    return await handler(request, **kwargs)


async def signed_in_user(request: web.Request) -> User:
    session = request[sessions.SESSION]
    user = await users_db.by_id(request.app[POOL], session.user_id)
    if user is None:  # deleted meanwhile: their sessions went with them
        raise NotFound("this account no longer exists")
    return user


# -- forms ------------------------------------------------------------------------------------


class FormInvalid(Exception):
    """A form's values were refused: the message of each field that was, by field name (""
    for the form as a whole)."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def form(request: web.Request) -> MultiDictProxy[Any]:
    return request[FORM]


def field_text(request: web.Request, name: str) -> str:
    """A form field's text ("" when absent), as typed."""
    return _text(request[FORM].get(name)) or ""


def field_values(request: web.Request, name: str) -> list[str]:
    """Every value of a form field sent several times (checkboxes of one name), as typed."""
    return [value for value in request[FORM].getall(name, []) if isinstance(value, str)]


def field_errors(
    errors: Mapping[str, str], items: Mapping[str, Sequence[str]] | None = None
) -> dict[str, str]:
    """Errors by field, for a form that sends a list in one field: `allowed_tools.2` goes next
    to `allowed_tools`, saying which of its `items` it is about (the item itself, as typed)."""
    by_field: dict[str, str] = {}
    for name, message in errors.items():
        field, dot, index = name.partition(".")
        if dot and index.isdigit():
            values = (items or {}).get(field, ())
            position = int(index)
            about = values[position] if position < len(values) else f"item {position + 1}"
            message = f"{about}: {message}"
        by_field[field] = f"{by_field[field]} {message}" if field in by_field else message
    return by_field


def validated(model: type[pydantic.BaseModel], values: Mapping[str, Any]) -> Any:
    """The API's own request model filled from a form (its text converted: "5" is 5 here, as
    a form can send nothing else); FormInvalid names each bad field."""
    try:
        return model.model_validate(dict(values), strict=False)
    except pydantic.ValidationError as exc:
        errors: dict[str, str] = {}
        for error in exc.errors(include_url=False):
            name = ".".join(str(part) for part in error["loc"]) or ""
            # pydantic prefixes the message of a validator's ValueError: not for people.
            errors.setdefault(name, error["msg"].removeprefix("Value error, "))
        raise FormInvalid(errors) from None


def api_errors(exc: ApiError) -> dict[str, str]:
    """An API error as form errors: `body.<field>: <message>` parts go next to their field,
    anything else above the form."""
    errors: dict[str, str] = {}
    for part in exc.detail.split("; "):
        where, colon, message = part.partition(": ")
        if colon and where.startswith("body."):
            errors.setdefault(where.removeprefix("body."), message)
        else:
            errors[""] = f"{errors[''] + ' ' if '' in errors else ''}{part}"
    return errors


def path_id(request: web.Request, name: str, what: str) -> uuid.UUID:
    """An id from the path; a malformed one is simply not found, as in the API."""
    found = parse_uuid(request.match_info[name])
    if found is None:
        raise NotFound(f"{what} not found")
    return found


def parse_uuid(raw: str | None) -> uuid.UUID | None:
    try:
        return uuid.UUID(raw) if raw else None
    except ValueError:
        return None


PAGE_SIZE = 50


def page_url(path: str, params: Mapping[str, str], offset: int, anchor: str = "") -> str:
    """A list page with its filters (empty ones left out) at an offset."""
    query = {name: value for name, value in params.items() if value}
    if offset:
        query["offset"] = str(offset)
    return f"{path}?{urlencode(query)}{anchor}" if query else f"{path}{anchor}"


def pager(
    path: str, params: Mapping[str, str], offset: int, shown: int, total: int, anchor: str = ""
) -> dict[str, Any]:
    """What the `pager` macro shows: this page's range and links to its neighbours."""
    return {
        "first": offset + 1 if shown else 0,
        "last": offset + shown,
        "total": total,
        "previous": page_url(path, params, max(offset - PAGE_SIZE, 0), anchor) if offset else None,
        "next": page_url(path, params, offset + PAGE_SIZE, anchor)
        if offset + shown < total
        else None,
    }


def redirect(location: str) -> web.Response:
    """A 303 to another page of the dashboard (a response, so it can carry cookies, and the
    pages' security headers)."""
    response = web.Response(status=303, headers={"Location": location})
    secure(response)
    return response


def login_url(request: web.Request) -> str:
    """The login page, coming back here after signing in."""
    if request.method != "GET" or request.path == "/":
        return "/login"
    return f"/login?next={quote(request.path_qs, safe='/')}"


def safe_next(target: str | None) -> str:
    """Only a path of this site, normalised: never an open redirect. Browsers drop tabs and
    newlines from a Location (`/<TAB>/evil` is `//evil`) and read `\\` as `/`, so a target
    with either is refused whole, as are ones with a scheme or a host."""
    if not target or any(c < " " or c in "\x7f\\" for c in target):
        return "/"
    try:
        url = URL(target)
    except ValueError:
        return "/"
    if url.scheme or url.host is not None or not url.path.startswith("/"):
        return "/"
    normalised = str(url)
    return normalised if normalised.startswith("/") and not normalised.startswith("//") else "/"
