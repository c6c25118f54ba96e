"""What the proxy sends upstream and passes back: the request headers forwarded (the caller's
credentials replaced by the server's, a charset other than UTF-8 refused), and the upstream's
answer with its own headers only."""

from __future__ import annotations

import functools

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.errors import (
    UnsupportedMediaType,
)

# Request headers sent upstream (plus every Mcp-Param-*); everything else stays here: hop-by-hop
# headers, Host, Content-Length, Origin, and the caller's Authorization, X-API-Key and Cookie.
_FORWARD = frozenset(
    {
        "accept",
        "content-type",
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
        "mcp-method",
        "mcp-name",
        "traceparent",
        "tracestate",
        "user-agent",
    }
)
_FORWARD_PREFIX = "mcp-param-"
# Response headers passed back. Content-Encoding too: should an upstream compress although we
# ask for identity, the bytes are passed through unchanged and must stay labelled.
PASS_BACK = (
    "Content-Type",
    "Content-Encoding",
    "Mcp-Session-Id",
    "Cache-Control",
    "Allow",
    "Retry-After",
)
# aiohttp would add its own; a transparent proxy sends only what the caller sent.
SKIP_AUTO_HEADERS = frozenset({"User-Agent", "Accept"})


def sends_auto_headers(headers: CIMultiDict[str]) -> bool:
    return "User-Agent" in headers and "Accept" in headers


@functools.lru_cache(maxsize=1024)  # callers send the same few header names again and again
def _forwarded(name: str) -> bool:
    lowered = name.lower()
    return lowered in _FORWARD or lowered.startswith(_FORWARD_PREFIX)


@functools.lru_cache(maxsize=512)  # a client sends the same header names on every request
def _forwarded_positions(
    names: tuple[str, ...], connection: str | None
) -> tuple[tuple[int, ...], int]:
    """Which of the request's headers go upstream, by position: forwarded ones, unless the
    Connection header names them (hop-by-hop); and where the Content-Type is among them (-1:
    none; aiohttp refuses a request with two)."""
    hop_by_hop = set()
    if connection:
        hop_by_hop = {token.strip().lower() for token in connection.split(",")}
    positions = tuple(
        i for i, name in enumerate(names) if _forwarded(name) and name.lower() not in hop_by_hop
    )
    types = [i for i in positions if names[i].lower() == "content-type"]
    return positions, types[0] if types else -1


def upstream_headers(
    incoming: CIMultiDictProxy[str], auth_headers: dict[str, str]
) -> CIMultiDict[str]:
    """The headers sent upstream. A body the gateway reads is read as UTF-8, so a request
    that tells the server otherwise (a charset that is not UTF-8) is refused (415): a server
    decoding it as UTF-7, say, would find calls the gateway never saw."""
    items = list(incoming.items())
    forwarded, content_type_at = _forwarded_positions(
        tuple([name for name, _ in items]), incoming.get("Connection")
    )
    if content_type_at >= 0 and items[content_type_at][1] != "application/json":
        _refuse_other_charsets(items[content_type_at][1])  # (the usual value needs no look)
    headers: CIMultiDict[str] = CIMultiDict([items[i] for i in forwarded])
    headers["Accept-Encoding"] = "identity"
    headers.update(auth_headers)
    return headers


@functools.lru_cache(maxsize=256)
def _charset_refusal(content_type: str) -> str | None:
    for parameter in content_type.split(";")[1:]:
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            return f"the gateway reads MCP requests as UTF-8, not {charset or 'no charset'}"
    return None


def _refuse_other_charsets(content_type: str) -> None:
    refusal = _charset_refusal(content_type)
    if refusal is not None:
        raise UnsupportedMediaType(refusal)


class UpstreamResponse(web.Response):
    """An upstream's answer passed back unchanged: its status and body are the server's, not
    the gateway API's (so they follow no schema of ours)."""

    # The upstream sent no Content-Type: aiohttp would add application/octet-stream.
    bare = False

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        _only_upstream_headers(self.headers, self.bare)


class UpstreamStream(web.StreamResponse):
    """An upstream's answer streamed back as it arrives."""

    bare = False

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        _only_upstream_headers(self.headers, self.bare)


def _only_upstream_headers(headers: CIMultiDict[str], bare: bool) -> None:
    """After aiohttp has added its defaults (in _prepare_headers, rather than in an
    on_response_prepare signal, which would cost every response of the gateway two coroutines):
    an upstream's reply carries its own headers only, and HTTP's framing and Date, no aiohttp
    Server, no Content-Type it did not send."""
    headers.popall("Server", None)
    if bare:
        headers.popall("Content-Type", None)


@functools.lru_cache(maxsize=256)  # aiohttp parses Content-Type afresh for every response
def is_event_stream(content_type: str | None) -> bool:
    if content_type is None:
        return False
    return content_type.partition(";")[0].strip().lower() == "text/event-stream"
