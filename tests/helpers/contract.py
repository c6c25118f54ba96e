"""Checks every API response of a test app against the app's own OpenAPI document."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web
from jsonschema import Draft202012Validator, FormatChecker

from gateway.api.openapi import OPENAPI_DOCUMENT
from gateway.errors import Handler
from gateway.proxy.headers import UpstreamResponse

# Any endpoint may answer these without documenting them.
_UNDOCUMENTED_OK = {503}
_ERROR_REF = "#/components/schemas/Error"


class ContractChecker:
    """An outermost middleware that records responses the OpenAPI document does not allow."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.violations: list[str] = []

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        # Streamed and proxied answers are the upstream's own, checked by the proxy tests.
        if isinstance(response, web.Response) and not isinstance(response, UpstreamResponse):
            self._check(request, response)
        return response

    def _check(self, request: web.Request, response: web.Response) -> None:
        where = f"{request.method} {request.path} -> {response.status}"
        # Other 5xx (the proxy's 502 and 504) must be documented like any status, checked below.
        if response.status == 500:
            self.violations.append(f"{where}: server error {response.text!r}")
            return
        body: Any = None
        if response.body:
            if response.content_type != "application/json":
                return
            body = orjson.loads(response.body)  # type: ignore[arg-type]
        resource = request.match_info.route.resource
        canonical = resource.canonical if resource is not None else None
        document = self.app[OPENAPI_DOCUMENT]
        operation = document["paths"].get(canonical or "", {}).get(request.method.lower())
        responses = {} if operation is None else operation["responses"]
        documented = responses.get(str(response.status))
        is_error_shape = (
            isinstance(body, dict) and set(body) == {"detail"} and isinstance(body["detail"], str)
        )
        # Every error is {"detail": ...} unless the document gives it another shape.
        own_shape = documented is not None and _ERROR_REF not in str(documented)
        if response.status >= 400 and not is_error_shape and not own_shape:
            self.violations.append(f"{where}: error body is not {{'detail': str}}: {body!r}")
        if operation is None:
            return  # not an API route (unknown path, static files)
        if documented is None:
            if response.status not in _UNDOCUMENTED_OK:
                self.violations.append(f"{where}: status not in the OpenAPI document")
            return
        schema = documented.get("content", {}).get("application/json", {}).get("schema")
        if schema is None:
            if body is not None:
                self.violations.append(f"{where}: documented without a body but has one")
            return
        validator = Draft202012Validator(
            {**schema, "components": document["components"]}, format_checker=FormatChecker()
        )
        for error in validator.iter_errors(body):
            path = "/".join(str(p) for p in error.absolute_path)
            self.violations.append(f"{where}: at '{path}': {error.message}")

    def assert_clean(self) -> None:
        assert not self.violations, "responses that break the OpenAPI document:\n" + "\n".join(
            self.violations
        )
