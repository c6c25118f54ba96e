"""/servers: the registry of upstream MCP servers, their stored credentials, on-demand probes."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import pydantic
from aiohttp import web
from pydantic import AfterValidator, ConfigDict, Field, StringConstraints, WithJsonSchema

from gateway.accounts.access import ADMIN, PRINCIPAL, READ
from gateway.api.health import HealthCheckOut
from gateway.api.models import (
    TRIMMED,
    Body,
    Documented,
    DocumentSchema,
    HttpUrl,
    Name,
    Offset,
    Out,
    Query,
    RateLimitText,
    ServerStatus,
    ToolPatterns,
    any_case,
    refuse_literal_destination,
)
from gateway.api.routing import API_PREFIX, Routes, validation_detail
from gateway.background.prober import Prober
from gateway.db import server_tools as server_tools_db
from gateway.db import servers as servers_db
from gateway.db.bounds import AtBound
from gateway.errors import BoundReached, NotFound, ValidationFailed
from gateway.keys import POOL, SETTINGS
from gateway.proxy.handler import PROXY_PATH, PROXYING
from gateway.security.credentials import (
    REFUSED_HEADER_NAMES,
    REFUSED_HEADER_PREFIXES,
    refused_header_name,
)
from gateway.security.secretbox import SECRET_BOX
from gateway.upstreams.servers import UPSTREAMS

routes = Routes("servers")

AuthType = Literal["bearer", "api_key", "basic"]

_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")
# The same rules, for the document: a token that is none of the refused names and starts with
# none of the refused prefixes (gateway/security/credentials.py says why each is refused).
_REFUSED = "|".join(any_case(name) for name in sorted(REFUSED_HEADER_NAMES))
_REFUSED_PREFIXES = "|".join(any_case(prefix) for prefix in REFUSED_HEADER_PREFIXES)
_HEADER_NAME_PATTERN = rf"^(?!(?:{_REFUSED})$)(?!(?:{_REFUSED_PREFIXES})){_HEADER_NAME.pattern}$"
_REFUSED_REASON = (
    "is not allowed as a credential header: hop-by-hop, framing and routing headers "
    "(Connection, Upgrade, TE, Host, Content-*, Expect, ...), proxy and client-address headers "
    "(Proxy-*, Forwarded, X-Forwarded-*, X-Real-IP, Via), Cookie, Set-Cookie, Origin, and "
    "those the gateway sets itself (Accept, Accept-Encoding, Last-Event-ID, Mcp-*, "
    "traceparent, tracestate, baggage) are refused"
)
# A GET /servers without `limit` answers every server up to this many.
MAX_PAGE = 1000


def _header_name(value: str) -> str:
    if not _HEADER_NAME.fullmatch(value):
        raise ValueError("must be a valid HTTP header name")
    if refused_header_name(value):
        raise ValueError(f"{value} {_REFUSED_REASON}")
    return value


def _header_safe(value: str) -> str:
    if not _HEADER_VALUE.fullmatch(value):
        raise ValueError("must be printable ASCII (it is sent in an HTTP header)")
    return value


def _no_colon(value: str) -> str:
    if ":" in value:
        raise ValueError("must not contain ':' (basic auth joins username:password)")
    return value


def _unique(tags: list[str]) -> list[str]:
    return list(dict.fromkeys(tags))


Description = Annotated[str, StringConstraints(strip_whitespace=True, max_length=2000)]
Tag = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=64), Documented(TRIMMED)
]
Tags = Annotated[list[Tag], Field(max_length=50), AfterValidator(_unique)]
HeaderSafe = Annotated[
    str,
    StringConstraints(min_length=1, max_length=8192),
    AfterValidator(_header_safe),
    Documented(r"^[\x20-\x7e]+$"),
]


class BearerCredentials(Body):
    token: HeaderSafe


class ApiKeyCredentials(Body):
    header_name: Annotated[
        str,
        StringConstraints(max_length=256),
        AfterValidator(_header_name),
        Documented(_HEADER_NAME_PATTERN),
    ]
    header_value: HeaderSafe


class BasicCredentials(Body):
    username: Annotated[
        str,
        StringConstraints(min_length=1, max_length=1024),
        AfterValidator(_no_colon),
        Documented(r"^[^:\u0000]+$"),
    ]
    password: Annotated[str, StringConstraints(max_length=8192)]


_CREDENTIAL_MODELS: dict[str, type[Body]] = {
    "bearer": BearerCredentials,
    "api_key": ApiKeyCredentials,
    "basic": BasicCredentials,
}

_CREDENTIAL_SCHEMAS = {
    name: {"title": name, **model.model_json_schema(schema_generator=DocumentSchema)}
    for name, model in _CREDENTIAL_MODELS.items()
}

# Validated against the auth_type by the handlers (the shape depends on a sibling field, or for
# a PATCH on the stored type); the document shows the three shapes.
Credentials = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "description": "write-only; the shape follows auth_type",
            "oneOf": list(_CREDENTIAL_SCHEMAS.values()),
        }
    ),
]


def _credentials_follow_auth_type(schema: dict[str, Any]) -> None:
    """The document states the rule _credentials applies: no credentials without an
    auth_type, and those of its shape with one."""
    schema["oneOf"] = [
        {"properties": {"auth_type": {"type": "null"}, "auth_credentials": {"type": "null"}}},
        *(
            {
                "properties": {"auth_type": {"const": name}, "auth_credentials": shape},
                "required": ["auth_type", "auth_credentials"],
            }
            for name, shape in _CREDENTIAL_SCHEMAS.items()
        ),
    ]


_DISABLED_TOOLS = (
    "tools nobody may call through the gateway (name globs, * and ?): a tools/call is refused "
    "with 403 and a tools/list leaves them out"
)
_SERVER_RATE_LIMIT = (
    "null: none; else at most this many tools/calls to the server from the workspace, every "
    "caller together, e.g. '600/minute' (over it: 429)"
)
_PIN_TOOLS = (
    "tool integrity: when true, a tool that is new or whose definition differs from the approved "
    "one is refused (403, -32003) and left out of tools/list until POST "
    "/servers/{id}/tools/approve approves it; turning it on approves the current definitions"
)


class ServerIn(Body):
    model_config = ConfigDict(json_schema_extra=_credentials_follow_auth_type)

    name: Name
    url: HttpUrl = Field(description="http(s) URL of the MCP endpoint (streamable HTTP)")
    description: Description = ""
    tags: Tags = Field(default_factory=list)
    auth_type: AuthType | None = None
    auth_credentials: Credentials | None = Field(
        default=None, description="required when auth_type is set; never returned"
    )
    disabled_tools: ToolPatterns = Field(default_factory=list, description=_DISABLED_TOOLS)
    rate_limit: RateLimitText | None = Field(default=None, description=_SERVER_RATE_LIMIT)
    pin_tools: bool = Field(
        default=False,
        description=f"{_PIN_TOOLS}; a server registered pinned has nothing approved yet, so its "
        "tools wait for approval once first seen",
    )


class ServerPatch(Body):
    """Only supplied fields change. `auth_type: null` clears the credentials; a new auth_type
    needs `auth_credentials` of its shape; `auth_credentials` alone replaces those of the
    current auth_type. A `url` on another origin clears the stored credentials (and
    auth_type) unless `auth_credentials` come with it."""

    # The document describes the safe subset: credentials alone fit the stored auth_type,
    # which a schema cannot know.
    model_config = ConfigDict(json_schema_extra=_credentials_follow_auth_type)

    name: Name | None = None
    url: HttpUrl | None = None
    description: Description | None = None
    tags: Tags | None = None
    auth_type: AuthType | None = None
    auth_credentials: Credentials | None = None
    disabled_tools: ToolPatterns | None = Field(default=None, description=_DISABLED_TOOLS)
    rate_limit: RateLimitText | None = Field(
        default=None, description=f"{_SERVER_RATE_LIMIT}; send null to remove it"
    )
    pin_tools: bool | None = Field(default=None, description=_PIN_TOOLS)


class ServerQuery(Query):
    limit: Annotated[
        int, Field(ge=1, le=MAX_PAGE, description=f"page size (default and max {MAX_PAGE})")
    ] = MAX_PAGE
    offset: Offset = 0
    status: ServerStatus | None = None
    tag: Annotated[str | None, Field(max_length=64, description="servers carrying this tag")] = None
    search: Annotated[
        str | None,
        Field(max_length=200, description="case-insensitive substring of name, description or url"),
    ] = None


class ServerOut(Out):
    id: uuid.UUID
    name: str
    url: str
    description: str
    tags: list[str]
    auth_type: AuthType | None
    has_credentials: bool
    status: ServerStatus = Field(description="status of the latest probe, `unknown` before one")
    last_checked_at: datetime | None
    last_latency_ms: float | None
    tool_count: int | None = Field(description="tools at the latest probe whose tools/list worked")
    tools_changed_at: datetime | None = Field(
        description="when a probe last saw the tool list differ from the one before; "
        "null while it has not changed since the first probe"
    )
    created_at: datetime
    updated_at: datetime
    disabled_tools: list[str] = Field(description=_DISABLED_TOOLS)
    rate_limit: str | None = Field(description=_SERVER_RATE_LIMIT)
    pin_tools: bool = Field(description=_PIN_TOOLS)
    tools_waiting: int = Field(
        description="tools of a server that pins them whose current definition is not approved "
        "(new or changed since): refused until approved; 0 when it does not pin them"
    )
    proxy_url: str = Field(
        description="the server's MCP endpoint for agents, through the gateway, with an API key "
        "as `Authorization: Bearer mcpg_…` or `X-API-Key`. Absolute: it starts with the "
        "PUBLIC_URL setting, the address users and agents reach the gateway at (default "
        "`http://{GATEWAY_HOST}:{GATEWAY_PORT}`)"
    )


def proxy_url(base_url: str, server_id: object) -> str:
    """The absolute URL agents use for a server: base_url is Settings.base_url (PUBLIC_URL)."""
    return f"{base_url}{API_PREFIX}{PROXY_PATH.format(server_id=server_id)}"


def _out(request: web.Request, server: dict[str, Any]) -> dict[str, Any]:
    """A server as the API shows it: the stored row and its proxy URL."""
    server["proxy_url"] = proxy_url(request.app[SETTINGS].base_url, server["id"])
    return server


def _credentials(auth_type: str | None, raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """The credentials for `auth_type`, validated; a 422 naming the field otherwise."""
    if auth_type is None:
        if raw is not None:
            raise ValidationFailed(
                "body.auth_credentials: not allowed without an auth_type (bearer, api_key "
                "or basic), which says how they are sent"
            )
        return None
    try:
        credentials = _CREDENTIAL_MODELS[auth_type].model_validate(raw or {})
    except pydantic.ValidationError as exc:
        raise ValidationFailed(validation_detail(exc, "body.auth_credentials")) from None
    return credentials.model_dump()


def _seal(request: web.Request, credentials: dict[str, Any] | None) -> bytes | None:
    return None if credentials is None else request.app[SECRET_BOX].seal(credentials)


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) as a browser compares origins: scheme and host in lower case, the
    default port (80, 443) written out."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


@routes.get("/servers", summary="Registered servers", access=READ, response=list[ServerOut])
async def list_servers(request: web.Request, query: ServerQuery) -> list[dict[str, Any]]:
    """Ordered by name. Filters combine (AND). Without `limit`, every server up to
    1000; `limit` and `offset` page through them (still a plain array)."""
    servers = await servers_db.list_servers(
        request.app[POOL],
        request[PRINCIPAL].workspace_id,
        status=query.status,
        tag=query.tag,
        search=query.search,
        limit=query.limit,
        offset=query.offset,
    )
    return [_out(request, server) for server in servers]


@routes.post(
    "/servers",
    summary="Register a server",
    access=ADMIN,
    status=201,
    response=ServerOut,
    errors=(400,),
)
async def create_server(request: web.Request, body: ServerIn) -> dict[str, Any]:
    """The credentials are encrypted at rest and never returned (`has_credentials` shows
    whether there are any). The first background probe follows within a few seconds.
    A workspace holds at most GATEWAY_MAX_SERVERS_PER_WORKSPACE servers (default 500):
    past that, 422."""
    refuse_literal_destination(request, "url", body.url)
    credentials = _credentials(body.auth_type, body.auth_credentials)
    limit = request.app[SETTINGS].max_servers_per_workspace
    async with request.app[POOL].acquire() as conn:
        try:
            created = await servers_db.create(
                conn,
                request[PRINCIPAL].workspace_id,
                name=body.name,
                url=body.url,
                description=body.description,
                tags=body.tags,
                auth_type=body.auth_type,
                credentials=_seal(request, credentials),
                disabled_tools=body.disabled_tools,
                rate_limit=body.rate_limit,
                pin_tools=body.pin_tools,
                limit=limit,
            )
        except AtBound:
            raise BoundReached(
                f"this workspace has {limit} servers",
                "GATEWAY_MAX_SERVERS_PER_WORKSPACE",
                "delete one first",
            ) from None
    return _out(request, created)


@routes.get("/servers/{server_id}", summary="One server", access=READ, response=ServerOut)
async def get_server(request: web.Request, server_id: uuid.UUID) -> dict[str, Any]:
    server = await servers_db.get(request.app[POOL], request[PRINCIPAL].workspace_id, server_id)
    if server is None:
        raise NotFound("server not found")
    return _out(request, server)


@routes.patch(
    "/servers/{server_id}",
    summary="Change a server",
    access=ADMIN,
    response=ServerOut,
    errors=(400,),
)
async def update_server(
    request: web.Request, server_id: uuid.UUID, body: ServerPatch
) -> dict[str, Any]:
    """Only supplied fields change. `auth_type: null` clears the credentials; changing
    `auth_type` needs `auth_credentials` of the new shape; `auth_credentials` alone replaces
    those of the current auth_type. A `url` on another origin (scheme, host or port) clears
    the stored credentials and auth_type, unless the same PATCH supplies new credentials: they
    were given for the old host only. A new url or new credentials are probed within seconds.
    `pin_tools: true` on a server that did not pin its tools approves their current
    definitions."""
    workspace_id = request[PRINCIPAL].workspace_id
    refuse_literal_destination(request, "url", body.url)
    async with request.app[POOL].acquire() as conn, conn.transaction():
        # Locked: the credentials' shape depends on the stored auth_type, and whether they
        # stay on the stored url.
        current = await servers_db.lock(conn, workspace_id, server_id)
        if current is None:
            raise NotFound("server not found")
        new_type = body.auth_type if "auth_type" in body.model_fields_set else current.auth_type
        # Re-sending the current auth_type without credentials (an edited copy of a GET) keeps
        # the stored ones.
        set_auth = new_type != current.auth_type or body.auth_credentials is not None
        credentials = _credentials(new_type, body.auth_credentials) if set_auth else None
        moved = body.url is not None and _origin(body.url) != _origin(current.url)
        if moved and body.auth_credentials is None:
            # Nothing new was supplied for the new host, so nothing is sent to it. The table
            # keeps auth_type and credentials both set or both null, so the type goes too.
            set_auth, new_type, credentials = True, None, None
        changes = servers_db.ServerChanges(
            name=body.name,
            url=body.url,
            description=body.description,
            tags=body.tags,
            set_auth=set_auth,
            auth_type=new_type,
            credentials=_seal(request, credentials),
            disabled_tools=body.disabled_tools,
            set_rate_limit="rate_limit" in body.model_fields_set,
            rate_limit=body.rate_limit,
            pin_tools=body.pin_tools,
        )
        server = await servers_db.update(conn, workspace_id, server_id, changes)
        assert server is not None  # locked above
        if body.pin_tools and not current.pin_tools:
            # Pinning starts from what the server lists now: all of it approved.
            await server_tools_db.approve(conn, server_id, None, notify=False)
            server["tools_waiting"] = 0
    request.app[UPSTREAMS].forget(server_id)
    return _out(request, server)


@routes.delete("/servers/{server_id}", summary="Delete a server and its history", access=ADMIN)
async def delete_server(request: web.Request, server_id: uuid.UUID) -> None:
    """Its health checks (and tool calls, alert rules and events) go with it."""
    if not await servers_db.delete(request.app[POOL], request[PRINCIPAL].workspace_id, server_id):
        raise NotFound("server not found")
    request.app[UPSTREAMS].forget(server_id)


@routes.post(
    "/servers/{server_id}/probe",
    summary="Probe a server now",
    access=ADMIN,
    response=HealthCheckOut,
    errors=(429,),
)
async def probe_server(request: web.Request, server_id: uuid.UUID) -> dict[str, Any]:
    """Connects (MCP `server/discover` or the `initialize` handshake) and lists tools with the
    stored credentials, then returns the stored health check. The server's status follows it.
    An unreachable or failing upstream is a `down` check, not an error of this request."""
    upstream = await request.app[UPSTREAMS].get(server_id, request[PRINCIPAL].workspace_id)
    if upstream is None:
        raise NotFound("server not found")
    # It holds an upstream connection as a proxied request does: counted with them.
    with request.app[PROXYING].in_flight.holding(upstream.workspace_id):
        check = await Prober.from_app(request.app).probe_and_record(
            upstream.id, upstream.workspace_id, upstream.url, upstream.auth_headers
        )
    if check is None:
        raise NotFound("server not found")  # deleted while it was being probed
    return check
