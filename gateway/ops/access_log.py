"""The access log (GATEWAY_ACCESS_LOG): one line per HTTP request, never a credential in it.

A line holds the client's address, the method and path, the status, the bytes sent and how
long the answer took. No header is logged (Authorization, X-API-Key and Cookie carry
credentials), no query value (dashboard links carry tokens there: only the names are kept),
and a path whose route takes a token (an invitation, an email verification) is logged as its
route's template. aiohttp calls it after each request only when it is configured: off, the
server has no access logger at all and a request pays nothing for it.
"""

from __future__ import annotations

import logging

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, Request, StreamResponse

LOGGER = logging.getLogger("gateway.access")


def _shown_path(request: BaseRequest) -> str:
    path = request.path
    if isinstance(request, Request):
        info = request.match_info
        resource = info.route.resource
        if resource is not None and any("token" in name for name in info):
            path = resource.canonical  # e.g. /invite/{token}
    query = request.rel_url.query
    if query:
        path += "?" + "&".join(f"{name}=..." for name in query)
    return path


class AccessLog(AbstractAccessLogger):
    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        self.logger.info(
            '%s "%s %s" %d %d B %.1f ms',
            request.remote or "-",
            request.method,
            _shown_path(request),
            response.status,
            response.body_length,
            time * 1000,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)
