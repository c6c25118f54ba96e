"""How a toolset reaches its member servers: a session with each, opened when a 2025-era client
initialises and ended with it; what it learnt of members that need no session; a session for
one request otherwise; and each request rewritten as the member takes it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from gateway.errors import BadGateway, GatewayTimeout
from gateway.mcp.client import (
    HANDSHAKE_PROTOCOL_VERSION,
    MODERN_PROTOCOL_VERSION,
    McpClient,
    end_session,
)
from gateway.mcp.errors import McpError
from gateway.mcp.headers import header_value
from gateway.proxy.headers import upstream_headers
from gateway.toolsets.registry import Toolset
from gateway.toolsets.sessions import MemberSession, Session
from gateway.upstreams.servers import Upstream, Upstreams

log = logging.getLogger(__name__)

# What a 2026-07-28 request carries in `_meta` instead of a handshake.
_META_PROTOCOL_VERSION: Final = "io.modelcontextprotocol/protocolVersion"
_META_CLIENT_INFO: Final = "io.modelcontextprotocol/clientInfo"
_META_CLIENT_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"
# Members known to need no session, at most (then forgotten, and learnt again).
_SESSIONLESS_KEPT: Final = 10_000


class Members:
    """How to reach members: the process's HTTP client and bounds, and what it learnt of the
    members that need no session (a 2026-07-28 or a stateless server), so that a client
    without a session with one reaches it without a handshake."""

    def __init__(self, http: aiohttp.ClientSession, upstreams: Upstreams, timeout: float) -> None:
        self._http = http
        self._upstreams = upstreams
        self._timeout = timeout
        # (server id, url) -> how to reach it
        self._sessionless: dict[tuple[uuid.UUID, str], MemberSession] = {}

    async def of(self, toolset: Toolset) -> list[Upstream]:
        """The toolset's member servers as the gateway reaches them, in order."""
        found = []
        for member in toolset.members:
            upstream = await self._upstreams.get(member.server_id, toolset.workspace_id)
            if upstream is not None:
                found.append(upstream)
        return found

    async def open(self, upstream: Upstream) -> MemberSession | None:
        """A session with a member, kept beyond this request (None: it cannot be reached)."""
        client = McpClient(self._http, upstream.url, upstream.auth_headers, self._timeout)
        try:
            async with asyncio.timeout(self._timeout):
                await client.connect()
        except (McpError, TimeoutError) as exc:
            log.info("toolset member %s not reached at initialize: %s", upstream.id, exc)
            await client.close()
            return None
        version, session_id = client.keep_session()
        member = MemberSession(upstream.id, version or HANDSHAKE_PROTOCOL_VERSION, session_id)
        self._learnt(upstream, member)
        return member

    async def end(self, upstreams: list[Upstream], session: Session) -> None:
        """DELETE the members' sessions of a client session (failures only logged)."""
        by_id = {upstream.id: upstream for upstream in upstreams}
        await asyncio.gather(
            *(
                end_session(
                    self._http,
                    by_id[member.server_id].url,
                    CIMultiDict(by_id[member.server_id].auth_headers),
                    member.session_id,
                    member.protocol_version,
                    min(self._timeout, 3.0),
                )
                for member in session.members
                if member.session_id is not None and member.server_id in by_id
            )
        )

    @contextlib.asynccontextmanager
    async def reached(
        self, upstream: Upstream, session: Session | None
    ) -> AsyncIterator[MemberSession]:
        """How this request reaches the member: the client's session with it, or what the
        gateway learnt of a member that needs none, or else a session for this request only
        (a 2026-07-28 client, or a member not reached at initialize), ended once its reply has
        passed."""
        member = None if session is None else session.member(upstream.id)
        if member is None:
            member = self._sessionless.get((upstream.id, upstream.url))
        if member is not None:
            yield member
            return
        one_off = McpClient(self._http, upstream.url, upstream.auth_headers, self._timeout)
        member = await self._one_off(one_off, upstream)
        self._learnt(upstream, member)
        try:
            yield member
        finally:
            await one_off.close()

    def answered(
        self, upstream: Upstream, member: MemberSession, response: web.StreamResponse
    ) -> None:
        """After a request: a member reached without a session that refuses it may want one
        now (the next request will see)."""
        if response.status in (400, 404) and member.session_id is None:
            self._sessionless.pop((upstream.id, upstream.url), None)

    async def _one_off(self, client: McpClient, upstream: Upstream) -> MemberSession:
        """A member reached for one request (the caller closes the client once it is done)."""
        try:
            async with asyncio.timeout(self._timeout):
                await client.connect()
        except TimeoutError:
            await client.close()
            raise GatewayTimeout(f"the server did not answer within {self._timeout:g} s") from None
        except McpError as exc:
            await client.close()
            raise BadGateway(f"cannot reach the server: {exc}") from None
        version = client.protocol_version or HANDSHAKE_PROTOCOL_VERSION
        return MemberSession(upstream.id, version, client.session_id)

    def _learnt(self, upstream: Upstream, member: MemberSession) -> None:
        key = (upstream.id, upstream.url)
        if member.session_id is not None:
            self._sessionless.pop(key, None)
            return
        if len(self._sessionless) >= _SESSIONLESS_KEPT:
            self._sessionless.clear()
        self._sessionless[key] = member


def modern(member: MemberSession) -> bool:
    return member.protocol_version == MODERN_PROTOCOL_VERSION


def forwarded(
    request: web.Request,
    message: dict[str, Any],
    params: dict[str, Any],
    name: str | None,
    member: MemberSession,
    upstream: Upstream,
    session: Session | None,
) -> tuple[bytes, CIMultiDict[str]]:
    """The request as the member takes it, with `params` (a tool's own name): the server's
    credentials, the member's version and session, and for a 2026-07-28 member what that era
    wants in headers (`Mcp-Name`: `name`) and in `_meta` (a 2025-era client's session says who
    the client is)."""
    headers = upstream_headers(request.headers, upstream.auth_headers)
    headers["MCP-Protocol-Version"] = member.protocol_version
    headers.popall("Mcp-Session-Id", None)
    if member.session_id is not None:
        headers["Mcp-Session-Id"] = member.session_id
    if modern(member):
        headers["Mcp-Method"] = message["method"]
        if name is not None:
            headers["Mcp-Name"] = header_value(name)
        if session is not None:
            meta = dict(params.get("_meta") or {})
            meta.setdefault(_META_PROTOCOL_VERSION, MODERN_PROTOCOL_VERSION)
            meta.setdefault(_META_CLIENT_INFO, session.client_info)
            meta.setdefault(_META_CLIENT_CAPABILITIES, session.client_capabilities)
            params["_meta"] = meta
    return orjson.dumps({**message, "params": params}), headers
