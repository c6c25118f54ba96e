"""The authorization server's mechanics, from authlib: PKCE, the grants, registration,
revocation, error responses and redirects, with an aiohttp face and PostgreSQL behind.

authlib's server API is synchronous and the gateway is asyncio: each authlib call runs in a
worker thread of a small pool of our own (`Bridge.run`), and the hooks it calls there
(query_client, save_authorization_code, ...) run their SQL on the event loop and wait for it
(`Bridge.wait`, run_coroutine_threadsafe with a timeout). The event loop never blocks, and
authlib's code runs as written: nothing of what it does (PKCE verification, error responses,
redirect building, `iss`) is done again here. The request body is read before (aiohttp reads
on the loop), so authlib only sees plain data.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import re
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import jwt
import orjson
from aiohttp import web
from authlib.common.security import generate_token
from authlib.oauth2.rfc6749 import (
    AuthorizationServer,
    InvalidClientError,
    InvalidGrantError,
    InvalidRequestError,
    JsonRequest,
    OAuth2Error,
    OAuth2Request,
)
from authlib.oauth2.rfc6749.grants import AuthorizationCodeGrant, RefreshTokenGrant
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7591 import (
    ClientMetadataClaims,
    ClientRegistrationEndpoint,
    InvalidClientMetadataError,
    InvalidRedirectURIError,
)
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc9207 import IssuerParameter
from multidict import MultiDict, MultiDictProxy

from gateway.config import Settings
from gateway.db import oauth as oauth_db
from gateway.db.oauth import CodeRow, GrantRow
from gateway.oauth import clients as clients_module
from gateway.oauth.clients import BadRedirectUri, Client, ClientRefused, Clients
from gateway.security.tokens import (
    InvalidToken,
    OAuthClaims,
    hash_token,
    issue_oauth_token,
    new_opaque_token,
    read_oauth_token,
)

T = TypeVar("T")

ACCESS_TOKEN_SECONDS = 3600
REFRESH_TOKEN_DAYS = 30
CODE_SECONDS = 60
# How long a hook waits for its SQL (the pool's own bounds come first).
_HOOK_SECONDS = 30.0
# authlib calls in flight at once per process (each holds a thread while its SQL runs).
_THREADS = 4

AUTHORIZE_PATH = "/oauth/authorize"
TOKEN_PATH = "/oauth/token"
REGISTER_PATH = "/oauth/register"
REVOKE_PATH = "/oauth/revoke"

# The MCP URLs a token may be for: a server's proxy URL or a toolset's, under PUBLIC_URL.
_RESOURCE_PATH = (
    r"/api/v1/(proxy|toolsets)/([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
    r"[0-9a-fA-F]{4}-[0-9a-fA-F]{12})/mcp"
)


class InvalidTargetError(OAuth2Error):  # type: ignore[misc]
    """RFC 8707 2: the resource is not one of ours (or not the one of the grant)."""

    error = "invalid_target"


@dataclass(frozen=True, slots=True)
class Resource:
    """One of our MCP URLs: a server's (kind "proxy") or a toolset's (kind "toolsets")."""

    url: str
    kind: str
    id: uuid.UUID

    @property
    def server_id(self) -> uuid.UUID | None:
        return self.id if self.kind == "proxy" else None

    @property
    def toolset_id(self) -> uuid.UUID | None:
        return self.id if self.kind == "toolsets" else None


def parse_resource(base_url: str, url: str | None) -> Resource | None:
    """The MCP URL `url` names under `base_url`, or None if it is none of ours."""
    if not url or not url.startswith(base_url + "/"):
        return None
    match = re.fullmatch(_RESOURCE_PATH, url[len(base_url) :])
    if match is None:
        return None
    return Resource(url, match[1], uuid.UUID(match[2]))


# -- the aiohttp face -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Incoming:
    """An HTTP request as authlib sees it, read on the event loop beforehand."""

    method: str
    uri: str
    query: MultiDictProxy[str]
    form: MultiDictProxy[str]
    json: dict[str, Any] | None
    headers: dict[str, str]

    @classmethod
    async def read(
        cls,
        request: web.Request,
        base_url: str,
        *,
        form: MultiDictProxy[str] | None = None,
        json: dict[str, Any] | None = None,
    ) -> Incoming:
        if form is None:
            form = MultiDictProxy(MultiDict())
        return cls(
            request.method,
            base_url + request.path_qs,
            MultiDictProxy(MultiDict(request.query)),
            form,
            json,
            dict(request.headers),
        )


class _Payload:
    """Query or form parameters: the first value of each, and all of them (authlib refuses
    repeated ones)."""

    def __init__(self, params: MultiDictProxy[str]) -> None:
        self.data = {key: params[key] for key in params}
        self.datalist = {key: params.getall(key) for key in params}

    @property
    def client_id(self) -> str | None:
        return self.data.get("client_id")

    @property
    def response_type(self) -> str | None:
        return self.data.get("response_type")

    @property
    def grant_type(self) -> str | None:
        return self.data.get("grant_type")

    @property
    def redirect_uri(self) -> str | None:
        return self.data.get("redirect_uri")

    @property
    def scope(self) -> str | None:
        return self.data.get("scope")

    @property
    def state(self) -> str | None:
        return self.data.get("state")


class AuthlibRequest(OAuth2Request):  # type: ignore[misc]
    def __init__(self, incoming: Incoming) -> None:
        super().__init__(incoming.method, incoming.uri, headers=incoming.headers)
        params = incoming.query if incoming.method == "GET" else incoming.form
        self.payload = _Payload(params)
        self._args = {key: incoming.query[key] for key in incoming.query}
        self._form = {key: incoming.form[key] for key in incoming.form}
        self.consent: Consent | None = None
        self.grant_row: GrantRow | None = None

    @property
    def args(self) -> dict[str, str]:
        return self._args

    @property
    def form(self) -> dict[str, str]:
        return self._form


class _JsonPayload:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data


class _JsonRequest(JsonRequest):  # type: ignore[misc]
    def __init__(self, incoming: Incoming) -> None:
        super().__init__(incoming.method, incoming.uri, incoming.headers)
        self.payload = _JsonPayload(incoming.json or {})


@dataclass
class Answer:
    """authlib's response: (status, body, headers); `location` is what IssuerParameter
    amends."""

    status: int
    body: Any
    headers: list[tuple[str, str]]

    @property
    def location(self) -> str | None:
        return next((v for k, v in self.headers if k.lower() == "location"), None)

    @location.setter
    def location(self, value: str) -> None:
        self.headers = [(k, v) for k, v in self.headers if k.lower() != "location"]
        self.headers.append(("Location", value))

    def response(self, extra: dict[str, str] | None = None) -> web.Response:
        headers = {**dict(self.headers), **(extra or {})}
        body = self.body
        if isinstance(body, (dict, list)):
            # authlib hands error bodies as a list of pairs.
            payload = dict(body) if isinstance(body, list) else body
            return web.Response(status=self.status, body=orjson.dumps(payload), headers=headers)
        return web.Response(status=self.status, text=body or None, headers=headers)


# -- the bridge between authlib's thread and the event loop ------------------------------------


class Bridge:
    """authlib's calls in worker threads; their hooks' SQL on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._threads = concurrent.futures.ThreadPoolExecutor(_THREADS, "oauth")

    async def run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._loop.run_in_executor(
            self._threads, functools.partial(call, *args, **kwargs)
        )

    def wait(self, coro: Coroutine[Any, Any, T]) -> T:
        """In a worker thread: run `coro` on the event loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(_HOOK_SECONDS)

    def close(self) -> None:
        # Not waited for on the event loop: a thread may be waiting for the loop itself.
        self._threads.shutdown(wait=False, cancel_futures=True)


# -- what a member consented to ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Consent:
    """The user authlib's grants see: a member consenting to one MCP URL."""

    user_id: uuid.UUID
    workspace_id: uuid.UUID
    resource: Resource


@dataclass(frozen=True, slots=True)
class _Code:
    """An authorization code row as authlib's AuthorizationCodeMixin asks."""

    code_hash: str
    row: CodeRow

    def get_redirect_uri(self) -> str:
        return self.row.redirect_uri

    def get_scope(self) -> str:
        return self.row.scope


@dataclass(frozen=True, slots=True)
class _Refresh:
    """A refresh token's grant as authlib's TokenMixin asks (already rotated)."""

    grant: GrantRow

    def check_client(self, client: Client) -> bool:
        return client.client_id == self.grant.client_id

    def get_scope(self) -> str:
        return self.grant.scope


# -- the server --------------------------------------------------------------------------------


class GatewayAuthorizationServer(AuthorizationServer):  # type: ignore[misc]
    def __init__(
        self, settings: Settings, pool: asyncpg.Pool, clients: Clients, bridge: Bridge
    ) -> None:
        super().__init__(scopes_supported=None)
        self.settings = settings
        self.issuer = settings.base_url
        self.pool = pool
        self.clients = clients
        self.bridge = bridge
        self.issuer_parameter = _Issuer(self.issuer)
        self.register_extension(lambda server: self.issuer_parameter(server))
        self.register_grant(_CodeGrant, [_S256Only(required=True)])
        self.register_grant(_RefreshGrant)
        self.register_endpoint(_Registration(self))
        self.register_endpoint(_Revocation(self))
        self.register_token_generator("default", self._generate_token)

    # authlib's hooks, in a worker thread.

    def query_client(self, client_id: str) -> Client:
        try:
            return self.bridge.wait(self.clients.find(client_id))
        except ClientRefused as exc:
            raise InvalidClientError(description=str(exc)) from None

    def save_token(self, token: dict[str, Any], request: AuthlibRequest) -> None:
        grant = request.grant_row
        assert grant is not None
        refresh_hash = hash_token(token["refresh_token"])
        if request.authorization_code is not None:
            code: _Code = request.authorization_code
            opened = self.bridge.wait(
                oauth_db.open_grant(
                    self.pool,
                    grant.id,
                    code.code_hash,
                    code.row,
                    grant.client_name,
                    refresh_hash,
                    REFRESH_TOKEN_DAYS,
                )
            )
        else:
            opened = self.bridge.wait(
                oauth_db.add_refresh(self.pool, grant.id, refresh_hash, REFRESH_TOKEN_DAYS)
            )
        if not opened:
            # The code was presented again, the grant ended, or the member left meanwhile.
            raise InvalidGrantError("this grant has ended")

    def _generate_token(
        self,
        grant_type: str,
        client: Client,
        user: GrantRow | None = None,
        scope: str | None = None,
        expires_in: int | None = None,
        include_refresh_token: bool = True,
    ) -> dict[str, Any]:
        assert user is not None
        claims = OAuthClaims(user.id, user.user_id, user.workspace_id, user.resource)
        access = issue_oauth_token(
            self.settings.jwt_secret, ACCESS_TOKEN_SECONDS, claims, self.issuer
        )
        return {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": ACCESS_TOKEN_SECONDS,
            "refresh_token": new_opaque_token(),
            "scope": scope or "",
        }

    def create_oauth2_request(self, request: Any) -> OAuth2Request:
        return request if isinstance(request, AuthlibRequest) else AuthlibRequest(request)

    def create_json_request(self, request: Incoming) -> JsonRequest:
        return _JsonRequest(request)

    def handle_response(self, status: int, body: Any, headers: Any) -> Answer:
        return Answer(status, body, list(headers))

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass

    # Used by the handlers, on the event loop.

    def resource(self, url: str | None) -> Resource | None:
        return parse_resource(self.issuer, url)

    def error_answer(self, request: OAuth2Request, error: OAuth2Error) -> Answer:
        """An error as authlib renders it: a redirect (with `iss`) when it has a verified
        redirect URI, else a JSON body."""
        answer: Answer = self.handle_error_response(request, error)
        self.issuer_parameter.add_issuer_parameter(self, answer)
        return answer


class _Issuer(IssuerParameter):  # type: ignore[misc]
    def __init__(self, issuer: str) -> None:
        self.issuer = issuer

    def get_issuer(self) -> str:
        return self.issuer


class _S256Only(CodeChallenge):  # type: ignore[misc]
    """PKCE required at authorize (authlib only requires it at the token endpoint), S256 only,
    and the method named (RFC 7636's default, plain, is refused)."""

    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]
    DEFAULT_CODE_CHALLENGE_METHOD = "S256"

    def validate_code_challenge(self, grant: Any, redirect_uri: str) -> None:
        data = grant.request.payload.data
        if not data.get("code_challenge"):
            raise InvalidRequestError("PKCE is required: send code_challenge (S256)")
        if data.get("code_challenge_method") != "S256":
            raise InvalidRequestError("code_challenge_method must be S256")
        super().validate_code_challenge(grant, redirect_uri)

    def get_authorization_code_challenge(self, authorization_code: _Code) -> str:
        return authorization_code.row.code_challenge

    def get_authorization_code_challenge_method(self, authorization_code: _Code) -> str:
        return "S256"


class _CodeGrant(AuthorizationCodeGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]
    server: GatewayAuthorizationServer

    def validate_authorization_request(self) -> str:
        redirect_uri: str = super().validate_authorization_request()
        # RFC 8707: the MCP URL the token will be for, required, and one of ours.
        if self.server.resource(self.request.payload.data.get("resource")) is None:
            raise InvalidTargetError(
                "resource must be the MCP URL of a server or toolset of this gateway",
                redirect_uri=redirect_uri,
            )
        if len(self.request.payload.datalist.get("resource", [])) > 1:
            raise InvalidTargetError("one resource per request", redirect_uri=redirect_uri)
        return redirect_uri

    def save_authorization_code(self, code: str, request: AuthlibRequest) -> None:
        consent = request.user
        assert isinstance(consent, Consent)
        data = request.payload.data
        row = CodeRow(
            client_id=request.client.client_id,
            workspace_id=consent.workspace_id,
            user_id=consent.user_id,
            resource=consent.resource.url,
            server_id=consent.resource.server_id,
            toolset_id=consent.resource.toolset_id,
            redirect_uri=data["redirect_uri"],
            scope=request.scope or "",
            code_challenge=data["code_challenge"],
        )
        self.server.bridge.wait(
            oauth_db.insert_code(self.server.pool, hash_token(code), row, CODE_SECONDS)
        )

    def query_authorization_code(self, code: str, client: Client) -> _Code | None:
        code_hash = hash_token(code)
        row = self.server.bridge.wait(
            oauth_db.consume_code(self.server.pool, code_hash, client.client_id)
        )
        return None if row is None else _Code(code_hash, row)

    def validate_token_request(self) -> None:
        super().validate_token_request()
        sent = self.request.form.get("resource")
        if sent is not None and sent != self.request.authorization_code.row.resource:
            raise InvalidTargetError("resource is not the one this code was issued for")

    def delete_authorization_code(self, authorization_code: _Code) -> None:
        pass  # consumed when queried; kept (used) so that a second use is recognised

    def authenticate_user(self, authorization_code: _Code) -> GrantRow:
        # The grant this exchange makes (saved with its refresh token in save_token).
        code = authorization_code.row
        client: Client = self.request.client
        grant = GrantRow(
            id=uuid.uuid4(),
            workspace_id=code.workspace_id,
            user_id=code.user_id,
            client_id=code.client_id,
            client_name=client.client_name,
            resource=code.resource,
            server_id=code.server_id,
            toolset_id=code.toolset_id,
            scope=code.scope,
            created_at=None,  # type: ignore[arg-type]
            last_used_at=None,
        )
        self.request.grant_row = grant
        return grant


class _RefreshGrant(RefreshTokenGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]
    INCLUDE_NEW_REFRESH_TOKEN = True
    server: GatewayAuthorizationServer

    def authenticate_refresh_token(self, refresh_token: str) -> _Refresh | None:
        # Rotated here, atomically: of two uses of one token only one gets a grant, and the
        # other ends it (reuse). Only for the client authenticated before (request.client).
        client: Client = self.request.client
        grant = self.server.bridge.wait(
            oauth_db.rotate_refresh(
                self.server.pool,
                hash_token(refresh_token),
                client.client_id,
                self.request.form.get("resource"),
            )
        )
        return None if grant is None else _Refresh(grant)

    def authenticate_user(self, refresh_token: _Refresh) -> GrantRow:
        self.request.grant_row = refresh_token.grant
        return refresh_token.grant

    def revoke_old_credential(self, refresh_token: _Refresh) -> None:
        pass  # rotated when authenticated


class _Claims(ClientMetadataClaims):  # type: ignore[misc]
    def validate_redirect_uris(self) -> None:
        try:
            clients_module.check_redirect_uris(self.get("redirect_uris"))
        except BadRedirectUri as exc:
            raise InvalidRedirectURIError(str(exc)) from None

    def validate_client_name(self) -> None:
        name = self.get("client_name")
        if name is not None and (
            not isinstance(name, str)
            or not name.strip()
            or len(name) > clients_module.MAX_NAME_CHARS
        ):
            raise InvalidClientMetadataError("client_name must be 1 to 200 characters")

    def validate_token_endpoint_auth_method(self) -> None:
        # Public clients only: whatever was asked, "none" (RFC 7591 3.2.1 lets the server
        # replace a requested value; every MCP client can use PKCE instead of a secret).
        self["token_endpoint_auth_method"] = "none"


class _Registration(ClientRegistrationEndpoint):  # type: ignore[misc]
    server: GatewayAuthorizationServer

    def __init__(self, server: GatewayAuthorizationServer) -> None:
        super().__init__(server, claims_classes=[_Claims])

    def authenticate_token(self, request: Any) -> bool:
        return True  # open registration, rate limited per address by the handler

    def get_server_metadata(self) -> dict[str, Any]:
        return server_metadata(self.server.issuer)

    def extract_client_metadata(self, request: Any) -> dict[str, Any]:
        data = request.payload.data
        data.pop("token_endpoint_auth_method", None)  # replaced with "none" (_Claims)
        if "redirect_uris" not in data:
            raise InvalidRedirectURIError("redirect_uris is required")
        metadata: dict[str, Any] = super().extract_client_metadata(request)
        metadata["token_endpoint_auth_method"] = "none"
        metadata.setdefault("grant_types", ["authorization_code"])
        metadata.setdefault("response_types", ["code"])
        name = metadata.get("client_name")
        metadata["client_name"] = (
            name.strip() if name else clients_module.default_name(metadata["redirect_uris"])
        )
        return metadata

    def generate_client_info(self, request: Any) -> dict[str, Any]:
        info: dict[str, Any] = super().generate_client_info(request)
        # A public client gets no secret (RFC 7591 3.2.1: client_secret is for confidential
        # clients).
        info.pop("client_secret", None)
        info.pop("client_secret_expires_at", None)
        return info

    def generate_client_id(self, request: Any) -> str:
        return "mcpg-" + str(generate_token(32))

    def save_client(
        self, client_info: dict[str, Any], client_metadata: dict[str, Any], request: Any
    ) -> None:
        self.server.bridge.wait(
            oauth_db.insert_client(
                self.server.pool,
                client_info["client_id"],
                client_metadata["client_name"],
                client_metadata["redirect_uris"],
                client_metadata,
            )
        )


class _Revocation(RevocationEndpoint):  # type: ignore[misc]
    """A refresh token ends its grant. An access token ends its grant too (it names it), when
    it is this client's. Anything else: 200 all the same (RFC 7009 2.2)."""

    CLIENT_AUTH_METHODS = ["none"]
    server: GatewayAuthorizationServer

    def query_token(self, token_string: str, token_type_hint: str | None) -> Any:
        return token_string  # found (or not) when revoked, in one statement

    def authenticate_token(self, request: Any, client: Client) -> Any:
        self.check_params(request, client)
        return request.form["token"]

    def revoke_token(self, token: str, request: Any) -> None:
        client_id = request.client.client_id
        ended = self.server.bridge.wait(
            oauth_db.revoke_by_refresh(self.server.pool, hash_token(token), client_id)
        )
        if ended:
            return
        grant_id = _grant_of_access_token(self.server, token)
        if grant_id is not None:
            self.server.bridge.wait(oauth_db.revoke_grant(self.server.pool, grant_id, client_id))


def _grant_of_access_token(server: GatewayAuthorizationServer, token: str) -> uuid.UUID | None:
    try:
        audience = jwt.decode(token, options={"verify_signature": False}).get("aud")
        if not isinstance(audience, str):
            return None
        return read_oauth_token(server.settings.jwt_secret, token, audience).grant_id
    except (jwt.PyJWTError, InvalidToken):
        return None


# -- the metadata document ---------------------------------------------------------------------


def server_metadata(issuer: str) -> dict[str, Any]:
    """RFC 8414: what an MCP client reads before anything else."""
    return {
        "issuer": issuer,
        "authorization_endpoint": issuer + AUTHORIZE_PATH,
        "token_endpoint": issuer + TOKEN_PATH,
        "registration_endpoint": issuer + REGISTER_PATH,
        "revocation_endpoint": issuer + REVOKE_PATH,
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "revocation_endpoint_auth_methods_supported": ["none"],
        "client_id_metadata_document_supported": True,
        "authorization_response_iss_parameter_supported": True,
    }


OAUTH_SERVER: web.AppKey[GatewayAuthorizationServer] = web.AppKey(
    "oauth_server", GatewayAuthorizationServer
)
