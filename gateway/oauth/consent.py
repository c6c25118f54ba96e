"""The authorize endpoint: a member signed in to the dashboard consents (or not) to a client
using one MCP URL of theirs, on a page of the dashboard.

GET /oauth/authorize checks the request with authlib (client, redirect URI, PKCE, the
`resource`), then asks to sign in (the login page comes back here), then checks the server or
toolset is in a workspace of the member, then shows the consent page. Its Allow and Deny
buttons POST the same parameters back with the dashboard's CSRF token. Errors about the client
or its redirect URI are pages (a browser is never sent to an unverified client); any other
error goes back to the client as the RFC says, with `state` and `iss`.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from authlib.oauth2.rfc6749 import OAuth2Error
from multidict import MultiDict, MultiDictProxy

from gateway.accounts.access import AUTHENTICATOR
from gateway.dashboard import sessions
from gateway.dashboard.pages import FORM, Pages, login_url, redirect, render, secure
from gateway.db import oauth as oauth_db
from gateway.errors import BadRequest, Forbidden, NotFound
from gateway.keys import POOL
from gateway.oauth import clients
from gateway.oauth.endpoints import oauth_server
from gateway.oauth.server import AUTHORIZE_PATH, Answer, AuthlibRequest, Consent, Incoming

pages = Pages()

# Form fields of the consent page that are not the authorization request's.
_OWN_FIELDS = (sessions.CSRF_FIELD, "decision")
# A host and port as a CSP source may name them.
_SOURCE = re.compile(r"[A-Za-z0-9.\-]*(\[[0-9A-Fa-f:.]+\])?(:[0-9]+)?")


@pages.get(AUTHORIZE_PATH, signed_in=False)
async def authorize_page(request: web.Request) -> web.StreamResponse:
    server = oauth_server(request)
    incoming = await Incoming.read(request, server.issuer)
    oauth_request = AuthlibRequest(incoming)
    session = request.get(sessions.SESSION)
    try:
        await server.bridge.run(server.get_consent_grant, oauth_request)
    except OAuth2Error as error:
        return _refused(server, oauth_request, error, signed_in=session is not None)
    if session is None:
        return redirect(login_url(request))
    consent, target = await _consent(request, oauth_request)
    client = oauth_request.client
    redirect_uri = oauth_request.payload.redirect_uri
    assert redirect_uri is not None  # required, and checked by the grant
    params = [(k, v) for k, v in incoming.query.items() if k not in _OWN_FIELDS]
    context = {
        "client_name": client.client_name,
        "client_id": client.client_id,
        "redirect_host": clients.redirect_host(redirect_uri),
        "mismatch": clients.name_mismatch(client.client_name, redirect_uri),
        "target_kind": "server" if consent.resource.kind == "proxy" else "toolset",
        "target_name": target.name,
        "workspace_name": target.workspace_name,
        "resource": consent.resource.url,
        "params": params,
    }
    response = await render(request, "oauth_consent.html", context)
    _allow_form_target(response, redirect_uri)
    return response


@pages.post(AUTHORIZE_PATH, signed_in=False)
async def authorize(request: web.Request) -> web.StreamResponse:
    """Allow or Deny, from the consent page (its CSRF token checked by the page wrapper)."""
    server = oauth_server(request)
    if request.get(sessions.SESSION) is None:
        raise Forbidden("sign in to the dashboard first, then allow the client again")
    form = request[FORM]
    params: MultiDict[str] = MultiDict(
        (k, v) for k, v in form.items() if k not in _OWN_FIELDS and isinstance(v, str)
    )
    incoming = await Incoming.read(request, server.issuer, form=MultiDictProxy(params))
    oauth_request = AuthlibRequest(incoming)
    try:
        grant = await server.bridge.run(server.get_consent_grant, oauth_request)
    except OAuth2Error as error:
        return _refused(server, oauth_request, error)
    consent, _ = await _consent(request, oauth_request)
    allowed = form.get("decision") == "allow"
    answer: Answer = await server.bridge.run(
        server.create_authorization_response, oauth_request, consent if allowed else None, grant
    )
    return _answer(answer)


async def _consent(request: web.Request, oauth_request: AuthlibRequest) -> tuple[Consent, Any]:
    """What the signed-in member consents to: 404 for an unknown server or toolset, 403 when
    it is not in a workspace of theirs."""
    server = oauth_server(request)
    resource = server.resource(oauth_request.payload.data.get("resource"))
    assert resource is not None  # checked by the grant
    session = request[sessions.SESSION]
    target = await oauth_db.target(request.app[POOL], resource.kind, resource.id)
    what = "server" if resource.kind == "proxy" else "toolset"
    if target is None:
        raise NotFound(f"this {what} was not found: the client asks for an MCP URL that is gone")
    role = await request.app[AUTHENTICATOR].role(target.workspace_id, session.user_id)
    if role is None:
        raise Forbidden(
            f"you are not a member of the workspace of this {what}: only its members can "
            "allow a client to use it"
        )
    return Consent(session.user_id, target.workspace_id, resource), target


def _refused(
    server: Any, oauth_request: AuthlibRequest, error: OAuth2Error, *, signed_in: bool = True
) -> web.StreamResponse:
    """An invalid authorization request: back to the client when its redirect URI is verified
    and the person signed in, else a page saying why.

    Anyone may register a redirect URI, so a bad request is sent back to one only for a person
    who signed in, never for a stranger following a link (RFC 9700 4.11.2: the gateway would
    be a redirector to anywhere). Nor after signing in through the login page: its
    form-action would stop the browser at a redirect to another origin."""
    if error.redirect_uri and signed_in:
        return _answer(server.error_answer(oauth_request, error))
    raise BadRequest(f"this authorization request cannot be served: {error.description}")


def _answer(answer: Answer) -> web.Response:
    response = web.Response(status=answer.status, headers={"Location": answer.location or "/"})
    secure(response)
    response.headers["Cache-Control"] = "no-store"
    return response


def _allow_form_target(response: web.StreamResponse, redirect_uri: str) -> None:
    """Browsers apply the page's form-action to where the form's answer redirects: let it go
    to the client's redirect URI (its origin, or its private-use scheme)."""
    parts = urlsplit(redirect_uri)
    if not _SOURCE.fullmatch(parts.netloc):
        return  # nothing that could read as more than a host (no ';', no space) goes in
    target = f"{parts.scheme}://{parts.netloc}" if parts.netloc else f"{parts.scheme}:"
    policy = response.headers["Content-Security-Policy"]
    response.headers["Content-Security-Policy"] = policy.replace(
        "form-action 'self'", f"form-action 'self' {target}"
    )
