"""Who is calling (JWT, API key, or an OAuth access token on the MCP URL it was issued for)
and whether their role lets them."""

from __future__ import annotations

import functools
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import cast

import asyncpg
from aiohttp import web

from gateway.caching.caches import MISSING, Caches, InvalidatedCache
from gateway.db import api_keys as api_keys_db
from gateway.db import memberships as memberships_db
from gateway.errors import Forbidden, NotFound, Unauthorized
from gateway.oauth.resources import Grants, challenge, resource_url
from gateway.policy.rules import KeyRules
from gateway.security.api_keys import KEY_PREFIX
from gateway.security.tokens import (
    InvalidToken,
    hash_token,
    is_oauth_token,
    read_access_token,
    read_oauth_token,
)


class Role(StrEnum):
    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}


@dataclass(frozen=True, slots=True)
class Access:
    """Who may call an endpoint; declared once per route (see gateway.api.routing)."""

    authenticated: bool = True
    # Lowest workspace role needed; None: any logged-in user, whatever their role.
    min_role: Role | None = None
    api_key: bool = False
    # Check the role in the workspace named by the {workspace_id} path parameter instead of
    # the workspace the token is scoped to.
    path_workspace: bool = False
    # What an API key does here: reads, or uses the workspace's servers (the proxy, ingestion).
    # Access alike today; named apart so that a key's rights can tell them apart.
    key_right: str = ""
    # Said after a 401's reason: what to send instead. MCP clients show the detail as it is,
    # so their endpoints name the API key's headers (and not the API's access tokens).
    hint: str = ""
    # An OAuth access token is good here, on the URL it was issued for (the MCP endpoints:
    # protected resources, whose 401s point to their metadata when OAuth is on).
    oauth: bool = False


# Anyone; credentials, if sent, are ignored (the OpenAPI document and the docs page).
PUBLIC = Access(authenticated=False, api_key=True)
# Signing in: no credentials needed, but an API key is refused (403), because API keys
# cannot manage accounts (SPEC: Authentication, rule 3).
SIGN_IN = Access(authenticated=False)
USER = Access()
READ = Access(min_role=Role.MEMBER, api_key=True, key_right="read")
# The proxy and tool-call ingestion: what an API key may do beyond reading.
USE = Access(min_role=Role.MEMBER, api_key=True, key_right="use")
# The MCP endpoints: USE, with a 401 that tells an MCP client's user what to send.
MCP = Access(
    min_role=Role.MEMBER,
    api_key=True,
    key_right="use",
    hint="send your API key as 'Authorization: Bearer mcpg_…' or 'X-API-Key: mcpg_…'",
    oauth=True,
)
# The MCP endpoints' hint when this gateway offers OAuth.
_OAUTH_HINT = (
    "connect with OAuth (your MCP client signs you in), or send your API key as "
    "'Authorization: Bearer mcpg_…' or 'X-API-Key: mcpg_…'"
)
ADMIN = Access(min_role=Role.ADMIN)
WS_MEMBER = Access(min_role=Role.MEMBER, path_workspace=True)
WS_ADMIN = Access(min_role=Role.ADMIN, path_workspace=True)
WS_OWNER = Access(min_role=Role.OWNER, path_workspace=True)


@dataclass(frozen=True, slots=True)
class Principal:
    workspace_id: uuid.UUID
    # None only on USER endpoints, when the user is no longer a member of the token's workspace.
    role: Role | None
    user_id: uuid.UUID | None = None
    api_key_id: uuid.UUID | None = None
    # What an API key may not do (governed access); None: a member, or a key with no rules.
    rules: KeyRules | None = None
    # An OAuth access token's client, by the name its member consented to (the call log's
    # caller_agent when the request names none); None: not an OAuth token.
    client_name: str | None = None


PRINCIPAL = web.RequestKey("principal", Principal)

API_KEY_HEADER = "X-API-Key"
# An API key may also come as a bearer token: many MCP clients can set only that. Keys start
# with KEY_PREFIX and access tokens (JWTs) never do, so the two cannot be mistaken.
_BEARER_KEY = "Bearer " + KEY_PREFIX
_KEY_REFUSED = "API keys cannot be used on this endpoint; log in instead"


class Authenticator:
    """Resolves credentials to a Principal with no database round trip once caches are warm."""

    def __init__(
        self, pool: asyncpg.Pool, jwt_secret: str, caches: Caches, oauth_base: str | None = None
    ) -> None:
        self._pool = pool
        self._jwt_secret = jwt_secret
        # PUBLIC_URL when this gateway offers OAuth (its MCP URLs are resources under it);
        # None: OAuth access tokens are refused everywhere, and 401s say nothing of OAuth.
        self._oauth_base = oauth_base
        # The grants behind OAuth access tokens (only OAuth callers look at them).
        self.grants = Grants(pool, caches)
        self.roles: InvalidatedCache[tuple[uuid.UUID, uuid.UUID], Role | None] = InvalidatedCache(
            "memberships"
        )
        # key hash -> the key's principal (the same for every request with that key).
        self.keys: InvalidatedCache[str, Principal | None] = InvalidatedCache("api_keys")
        # key id -> last use (epoch seconds); written to the database in batches.
        self.key_usage: dict[uuid.UUID, float] = {}
        caches.register(self.roles, {"memberships": self._drop_membership})
        caches.register(self.keys, {"api_keys": self.keys.drop})

    def _drop_membership(self, key: str) -> None:
        workspace_id, _, user_id = key.partition(":")
        self.roles.drop((uuid.UUID(workspace_id), uuid.UUID(user_id)))

    def forget_membership(self, workspace_id: uuid.UUID, user_id: uuid.UUID) -> None:
        """Drop at once in this process; other processes hear it through NOTIFY."""
        self.roles.drop((workspace_id, user_id))

    def forget_workspace(self, workspace_id: uuid.UUID) -> None:
        self.roles.drop_where(lambda key: key[0] == workspace_id)
        self.keys.clear()

    async def role(self, workspace_id: uuid.UUID, user_id: uuid.UUID) -> Role | None:
        async def load() -> Role | None:
            raw = await memberships_db.role_of(self._pool, workspace_id, user_id)
            return None if raw is None else Role(raw)

        return await self.roles.get((workspace_id, user_id), load)

    async def _load_key(self, key_hash: str) -> Principal | None:
        key = await api_keys_db.find_active(self._pool, key_hash)
        if key is None:
            return None
        rules = KeyRules.of(
            key.id, key.permissions, key.allowed_servers, key.allowed_tools, key.rate_limit
        )
        return Principal(
            workspace_id=key.workspace_id, role=Role.MEMBER, api_key_id=key.id, rules=rules
        )

    def cached(self, request: web.Request, access: Access) -> Principal:
        """As authenticate() for a cached API key (every proxied call of an agent), without a
        coroutine; else MISSING, and authenticate() decides."""
        headers = request.headers
        # A bearer credential comes first, as in authenticate().
        raw_key = headers.get("Authorization")
        if raw_key is None:
            raw_key = headers.get(API_KEY_HEADER)
            if raw_key is None:
                return cast(Principal, MISSING)
        elif raw_key.startswith(_BEARER_KEY):
            raw_key = raw_key[7:]  # after "Bearer "
        else:
            return cast(Principal, MISSING)
        principal = self.keys.peek(_key_hash(raw_key.strip()))
        if principal is MISSING:
            return cast(Principal, MISSING)
        try:  # (free unless raised: a revoked key, cached as None)
            return self._key_principal(principal, access)
        except _Refused as refused:
            raise self._challenged(request, access, refused) from None

    async def authenticate(self, request: web.Request, access: Access) -> Principal:
        """Who is calling: a bearer credential if there is one (an access token, an OAuth
        access token, or an API key as a bearer token), else an X-API-Key; a 401 ends with
        what to send instead."""
        try:
            authorization = request.headers.get("Authorization")
            if authorization is not None:
                scheme, _, token = authorization.partition(" ")
                token = token.strip()
                if scheme.lower() != "bearer" or not token:
                    raise _refused("the Authorization header must be 'Bearer <token>'", access)
                if token.startswith(KEY_PREFIX):
                    return await self._api_key(token, access)
                return await self._user_principal(request, token, access)
            raw_key = request.headers.get(API_KEY_HEADER)
            if raw_key is not None:
                return await self._api_key(raw_key.strip(), access)
            raise _refused("authentication required", access)
        except _Refused as refused:
            raise self._challenged(request, access, refused) from None

    def _challenged(self, request: web.Request, access: Access, refused: _Refused) -> Unauthorized:
        """A 401 of an MCP URL, when this gateway offers OAuth: it says where the URL's
        metadata is (RFC 9728 5.1), so an MCP client can start authorizing, and `invalid_token`
        when the credential sent was refused; its detail names OAuth beside API keys."""
        base_url = self._oauth_base
        if not access.oauth or base_url is None:
            return refused
        headers = request.headers
        sent = "Authorization" in headers or API_KEY_HEADER in headers
        header = challenge(base_url, request.path, invalid_token=sent)
        return Unauthorized(
            f"{refused.reason}: {_OAUTH_HINT}", headers={"WWW-Authenticate": header}
        )

    async def _api_key(self, raw_key: str, access: Access) -> Principal:
        key_hash = _key_hash(raw_key)
        principal = self.keys.peek(key_hash)
        if principal is MISSING:
            principal = await self.keys.get(key_hash, lambda: self._load_key(key_hash))
        return self._key_principal(principal, access)

    async def _user_principal(self, request: web.Request, token: str, access: Access) -> Principal:
        try:
            claims = read_access_token(self._jwt_secret, token)
        except InvalidToken as exc:
            if self._oauth_base is not None and is_oauth_token(token):
                return await self._oauth_principal(request, token, access, self._oauth_base)
            raise _refused(str(exc), access) from None
        workspace_id = claims.workspace_id
        if access.path_workspace:
            workspace_id = path_uuid(request, "workspace_id", "workspace")
        return await self.authorize(claims.user_id, workspace_id, access)

    async def _oauth_principal(
        self, request: web.Request, token: str, access: Access, base_url: str
    ) -> Principal:
        """An OAuth access token acts as the member who consented, on the one MCP URL it was
        issued for, while its grant stands and the member belongs to the workspace. Once
        warm, that costs no database round trip: the grant and the role come from caches that
        NOTIFY keeps fresh, so a revocation or a departure ends the token at once."""
        if not access.oauth:
            raise _refused(_OAUTH_ELSEWHERE, access)
        try:
            claims = read_oauth_token(self._jwt_secret, token, resource_url(base_url, request.path))
        except InvalidToken as exc:
            raise _refused(str(exc), access) from None
        grant = await self.grants.get(claims.grant_id)
        if (
            grant is None
            or grant.user_id != claims.user_id
            or grant.workspace_id != claims.workspace_id
            or grant.resource != claims.resource
        ):
            raise _refused("this app's access was revoked: connect it again", access)
        role = await self.role(grant.workspace_id, grant.user_id)
        if role is None:
            raise _refused(
                "the member who connected this app is no longer in the workspace", access
            )
        self.grants.used(grant.id)
        return Principal(
            workspace_id=grant.workspace_id,
            role=role,
            user_id=grant.user_id,
            client_name=grant.client_name,
        )

    async def authorize(
        self, user_id: uuid.UUID, workspace_id: uuid.UUID, access: Access
    ) -> Principal:
        """The user acting in a workspace, if their role there is enough for `access` (the
        API's bearer tokens and the dashboard's sessions alike)."""
        role = await self.role(workspace_id, user_id)
        if access.min_role is not None:
            if role is None:
                if access.path_workspace:
                    raise NotFound("workspace not found")
                raise Forbidden("you are not a member of this workspace")
            if role.rank < access.min_role.rank:
                raise Forbidden(f"this action requires the {access.min_role} role or higher")
        return Principal(workspace_id=workspace_id, role=role, user_id=user_id)

    def _key_principal(self, principal: Principal | None, access: Access) -> Principal:
        if principal is None:
            raise _refused("invalid or revoked API key", access)
        if not access.api_key:
            raise Forbidden(_KEY_REFUSED)
        # Governed access: a key without `read` reads nothing (the proxy checks `proxy`,
        # ingestion `ingest`).
        rules = principal.rules
        if rules is not None and access.key_right == "read" and "read" not in rules.permissions:
            raise Forbidden("this API key does not have the read permission")
        assert principal.api_key_id is not None
        self.key_usage[principal.api_key_id] = time.time()
        return principal


_HINT = "send 'Authorization: Bearer <access token>' or an API key as 'X-API-Key'"
_OAUTH_ELSEWHERE = "an OAuth access token is good only on the MCP URL it was issued for"


class _Refused(Unauthorized):
    """A 401 that keeps its reason apart from the hint, for the MCP URLs' OAuth challenge."""

    def __init__(self, reason: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail, headers=headers)
        self.reason = reason


def _refused(reason: str, access: Access) -> _Refused:
    """A 401 in one line: why, then what to send. Without credentials the API says how to
    send them; otherwise only an endpoint with a hint of its own (the MCP endpoints) adds one.
    With OAuth on, the MCP endpoints' 401 becomes a challenge (Authenticator._challenged)."""
    if access.hint:
        # RFC 9110: a 401 names the scheme to use.
        headers = {"WWW-Authenticate": "Bearer"}
        return _Refused(reason, f"{reason}: {access.hint}", headers=headers)
    if reason == "authentication required":
        return _Refused(reason, f"{reason}: {_HINT}")
    return _Refused(reason, reason)


def refuse_api_key(request: web.Request, access: Access) -> None:
    """On endpoints that need no credentials, an API key (in either header) is still refused
    where keys may not go, rather than silently ignored."""
    if access.api_key:
        return
    headers = request.headers
    if API_KEY_HEADER in headers or _is_bearer_key(headers.get("Authorization")):
        raise Forbidden(_KEY_REFUSED)


def _is_bearer_key(authorization: str | None) -> bool:
    if authorization is None:
        return False
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and token.strip().startswith(KEY_PREFIX)


def path_uuid(request: web.Request, name: str, what: str) -> uuid.UUID:
    """A UUID path parameter; a malformed one is simply an unknown id (404)."""
    try:
        return _parse_uuid(request.match_info[name])
    except (KeyError, ValueError):
        raise NotFound(f"{what} not found") from None


# Parsing a UUID costs about a microsecond; the proxy sees the same few server ids all day.
_parse_uuid = functools.lru_cache(maxsize=4096)(uuid.UUID)
# And agents send the same few keys: a SHA-256 per call cost as much as the call's log entry.
_key_hash = functools.lru_cache(maxsize=1024)(hash_token)


AUTHENTICATOR: web.AppKey[Authenticator] = web.AppKey("authenticator")
