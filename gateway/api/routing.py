"""Declaring API routes: access, request models and response shape in one decorator.

A handler is `async def f(request, [body], [query], [<path params>])`. Parameters named `body`
and `query` are validated from the JSON body and the query string with their annotated type;
parameters named like a `{placeholder}` of the path come from the path: annotated `uuid.UUID`
they are parsed (malformed means 404), annotated `str` they are passed as they are. The handler
returns plain data (dicts, lists, dataclasses, pydantic models), None for 204, or its own
StreamResponse.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import typing
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pydantic
from aiohttp import web

from gateway.accounts.access import (
    AUTHENTICATOR,
    PRINCIPAL,
    Access,
    Authenticator,
    path_uuid,
    refuse_api_key,
)
from gateway.caching.caches import MISSING
from gateway.errors import BadRequest, RequestTimeout, UnsupportedMediaType, ValidationFailed
from gateway.keys import SETTINGS

API_PREFIX = "/api/v1"


@dataclass(frozen=True, slots=True)
class Endpoint:
    method: str
    path: str
    summary: str
    access: Access
    status: int
    response: Any
    body: Any
    query: type[pydantic.BaseModel] | None
    # Every {placeholder} of the path, in order, with its type (uuid.UUID or str).
    path_params: tuple[tuple[str, type], ...]
    errors: tuple[int, ...]
    tag: str
    description: str = ""
    # What the success response is, when the handler renders it itself (e.g. text/html).
    media_type: str = "application/json"
    # The body's type for the document only, when the handler parses the body itself.
    request_body: Any = None
    # Error statuses whose body is not {"detail": ...}, with their shape (the proxy answers
    # MCP clients in JSON-RPC).
    error_bodies: tuple[tuple[int, Any], ...] = ()
    # Other success statuses, answered without a body (an MCP notification's 202).
    bodiless: tuple[int, ...] = ()


@dataclass
class Routes:
    """The endpoints of one API module, collected by decorators and mounted by the app."""

    tag: str
    endpoints: list[tuple[Endpoint, Callable[..., Awaitable[Any]]]] = field(default_factory=list)

    def route(
        self,
        method: str,
        path: str,
        *,
        summary: str,
        access: Access,
        status: int = 200,
        response: Any = None,
        errors: Iterable[int] = (),
        media_type: str = "application/json",
        request_body: Any = None,
        error_bodies: dict[int, Any] | None = None,
        bodiless: Iterable[int] = (),
    ) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
        def decorate(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            hints = typing.get_type_hints(fn)
            path_params = _path_params(path, access, hints)
            endpoint = Endpoint(
                method=method,
                path=path,
                summary=summary,
                access=access,
                status=status,
                response=response,
                body=hints.get("body"),
                query=hints.get("query"),
                path_params=path_params,
                errors=_errors_for(access, hints, path_params, errors),
                tag=self.tag,
                description=inspect.cleandoc(fn.__doc__ or ""),
                media_type=media_type,
                request_body=request_body,
                error_bodies=tuple((error_bodies or {}).items()),
                bodiless=tuple(bodiless),
            )
            self.endpoints.append((endpoint, fn))
            return fn

        return decorate

    def get(self, path: str, **kw: Any) -> Callable[[Callable[..., Awaitable[Any]]], Any]:
        return self.route("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Callable[[Callable[..., Awaitable[Any]]], Any]:
        return self.route("POST", path, **kw)

    def patch(self, path: str, **kw: Any) -> Callable[[Callable[..., Awaitable[Any]]], Any]:
        return self.route("PATCH", path, **kw)

    def delete(self, path: str, **kw: Any) -> Callable[[Callable[..., Awaitable[Any]]], Any]:
        return self.route("DELETE", path, status=204, **kw)


def _path_params(path: str, access: Access, hints: dict[str, Any]) -> tuple[tuple[str, type], ...]:
    params = []
    for name in re.findall(r"{(\w+)}", path):
        kind = hints.get(name)
        if kind is None:
            # Not taken by the handler: {workspace_id} is still checked by the authenticator.
            kind = uuid.UUID if name == "workspace_id" and access.path_workspace else str
        if kind not in (uuid.UUID, str):
            raise TypeError(f"{path}: path parameter {name!r} must be annotated uuid.UUID or str")
        params.append((name, kind))
    return tuple(params)


def _errors_for(
    access: Access,
    hints: dict[str, Any],
    path_params: tuple[tuple[str, type], ...],
    extra: Iterable[int],
) -> tuple[int, ...]:
    codes = set(extra)
    if access.authenticated:
        codes.add(401)
    if access.min_role is not None or not access.api_key:
        codes.add(403)  # role too low, or an API key where keys may not go
    if "body" in hints:
        codes.update((400, 408, 413, 415, 422))
    if any(kind is str for _, kind in path_params):
        codes.add(422)  # a NUL character in a path segment
    if "query" in hints:
        codes.add(422)
    if path_params:
        codes.add(404)
    return tuple(sorted(codes))


def validation_detail(exc: pydantic.ValidationError, where: str) -> str:
    """One readable line naming each failing field, e.g. 'body.password: String should ...'."""
    parts = []
    for error in exc.errors(include_url=False):
        location = ".".join([where, *(str(p) for p in error["loc"])])
        # pydantic prefixes the message of a validator's ValueError: not for people.
        parts.append(f"{location}: {error['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


class _Handler:
    """The aiohttp handler for one endpoint: authenticates, reads the inputs, renders."""

    __slots__ = ("access", "authenticator", "body_adapter", "endpoint", "fn", "params")

    def __init__(self, endpoint: Endpoint, fn: Callable[..., Awaitable[Any]]) -> None:
        self.endpoint = endpoint
        self.access = endpoint.access
        self.fn = fn
        takes = frozenset(inspect.signature(fn).parameters)
        # The path parameters the function takes: (name, a UUID?, what to call it in errors),
        # worked out once rather than on every request.
        self.params = tuple(
            (name, kind is uuid.UUID, name.removesuffix("_id").replace("_", " "))
            for name, kind in endpoint.path_params
            if name in takes
        )
        self.body_adapter = (
            pydantic.TypeAdapter(endpoint.body) if endpoint.body is not None else None
        )
        # The app's, once the first request has looked it up (it is made at startup, after
        # the routes): an app[key] lookup is a Python call that every proxied request paid.
        self.authenticator: Authenticator | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        endpoint = self.endpoint
        access = self.access
        if access.authenticated:
            authenticator = self.authenticator
            if authenticator is None:
                authenticator = self.authenticator = request.app[AUTHENTICATOR]
            principal = authenticator.cached(request, access)
            if principal is MISSING:
                principal = await authenticator.authenticate(request, access)
            request[PRINCIPAL] = principal
        else:
            refuse_api_key(request, access)
        kwargs: dict[str, Any] = {}
        for name, is_uuid, what in self.params:
            kwargs[name] = path_uuid(request, name, what) if is_uuid else path_text(request, name)
        if self.body_adapter is not None:
            kwargs["body"] = await read_body(request, self.body_adapter)
        if endpoint.query is not None:
            kwargs["query"] = read_query(request, endpoint.query)
        result = await self.fn(request, **kwargs)
        if _is_response(result):
            return result
        if result is None:
            return web.Response(status=204)
        return json_response(result, endpoint.status)


# Whether a handler's result type is a response (see _is_response).
_RESPONSE_TYPES: dict[type, bool] = {}


def _is_response(result: object) -> typing.TypeGuard[web.StreamResponse]:
    """isinstance(result, web.StreamResponse), remembered per type: StreamResponse is an ABC
    (a MutableMapping), so each isinstance() runs Python code, on every proxied call."""
    kind = type(result)
    known = _RESPONSE_TYPES.get(kind)
    if known is None:
        known = _RESPONSE_TYPES[kind] = issubclass(kind, web.StreamResponse)
    return known


async def read_bytes(request: web.Request) -> bytes:
    """The whole body, received within GATEWAY_BODY_TIMEOUT_SECONDS (else 408): a client
    sending its headers and then a trickle, or nothing, does not hold a connection for long.
    A body already complete (most) is read without a timer."""
    if request.content.is_eof():
        return await request.read()
    seconds = request.app[SETTINGS].body_timeout_seconds
    try:
        async with asyncio.timeout(seconds):
            return await request.read()
    except TimeoutError:
        # Answered at once; aiohttp then closes the connection (after at most its 10 s of
        # lingering for the rest of the body).
        raise RequestTimeout(f"the request body did not arrive within {seconds:g} s") from None


async def read_body(request: web.Request, adapter: pydantic.TypeAdapter[Any]) -> Any:
    raw = await read_bytes(request)
    if not raw.strip():
        raise BadRequest("request body is required (JSON)")
    check_json(request, raw)
    try:
        return adapter.validate_json(raw)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise BadRequest("request body is not valid JSON") from None
        # The top level itself has the wrong type (e.g. an array where an object belongs).
        if all(not e["loc"] for e in errors):
            raise BadRequest("request body must be a JSON object") from None
        raise ValidationFailed(validation_detail(exc, "body")) from None


def check_json(request: web.Request, raw: bytes) -> None:
    """A body must say it is JSON (else 415) and be standard JSON: pydantic's parser would
    take NaN and Infinity, which JSON has not (400)."""
    kind = request.content_type  # application/octet-stream when the header is absent
    if kind != "application/json" and not kind.endswith("+json"):
        raise UnsupportedMediaType(
            f"request body must be JSON, sent with Content-Type: application/json (not {kind})"
        )
    if b"NaN" in raw or b"Infinity" in raw:  # perhaps only inside strings: parse to know
        try:
            orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise BadRequest(
                "request body is not valid JSON (NaN and Infinity are not JSON numbers)"
            ) from None


def path_text(request: web.Request, name: str) -> str:
    """A text path segment; one with a NUL character is refused by name."""
    value = request.match_info[name]
    if "\x00" in value:
        raise ValidationFailed(f"path.{name}: must not contain NUL characters")
    return value


def read_query(request: web.Request, model: type[pydantic.BaseModel]) -> Any:
    try:
        return model.model_validate(dict(request.query))
    except pydantic.ValidationError as exc:
        raise ValidationFailed(validation_detail(exc, "query")) from None


def _default(value: Any) -> Any:
    # asyncpg returns its own UUID subclass, which orjson does not recognise as a UUID.
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"cannot serialise {type(value).__name__}")


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(data, default=_default), content_type="application/json"
    )


def _routed(endpoint: Endpoint) -> str:
    """The path as the router matches it: a UUID placeholder takes hex digits and hyphens
    only, so `/members/invite` never reaches the `/members/{user_id}` handlers and a 405's
    Allow lists just the methods the path really has."""
    path = endpoint.path
    for name, kind in endpoint.path_params:
        if kind is uuid.UUID:
            path = path.replace(f"{{{name}}}", f"{{{name}:[0-9A-Fa-f-]+}}")
    return path


def mount(app: web.Application, modules: Iterable[Routes]) -> list[Endpoint]:
    """Add every endpoint under /api/v1; returns them for the OpenAPI document. ENDPOINT_OF
    maps each handler function to its endpoint (the dashboard calls handlers under the same
    access rules)."""
    endpoints = []
    endpoint_of: dict[Callable[..., Any], Endpoint] = {}
    for routes in modules:
        for endpoint, fn in routes.endpoints:
            app.router.add_route(
                endpoint.method, API_PREFIX + _routed(endpoint), _Handler(endpoint, fn).handle
            )
            endpoints.append(endpoint)
            endpoint_of.setdefault(fn, endpoint)
    app[ENDPOINT_OF] = endpoint_of
    return endpoints


# Every endpoint mounted, for the OpenAPI document and the tests.
ENDPOINTS: web.AppKey[list[Endpoint]] = web.AppKey("endpoints")
# Each API handler function's endpoint: its access rules, for the dashboard's calls.
ENDPOINT_OF: web.AppKey[dict[Callable[..., Any], Endpoint]] = web.AppKey("endpoint_of")
