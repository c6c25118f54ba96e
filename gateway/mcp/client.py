"""The gateway's own MCP client: streamable HTTP (2026-07-28 or handshake) on a shared session."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import AsyncIterator, Hashable, Mapping
from types import TracebackType
from typing import Any, Final, Literal, Self
from urllib.parse import urlsplit

import aiohttp
import orjson
from multidict import CIMultiDict

from gateway.mcp.errors import (
    McpConnectionError,
    McpError,
    McpHttpError,
    McpResponseError,
    McpRpcError,
    McpTimeoutError,
    ToolListTooLarge,
    UnsupportedTransport,
    host_of,
)
from gateway.mcp.headers import MANAGED_HEADERS, header_value, param_header_map, param_headers
from gateway.mcp.sse import SseError, SseParser
from gateway.mcp.tool_list_budget import (
    MAX_TOOL_LIST_BYTES,
    MAX_TOOLS,
    MiB,
    ToolListHold,
    ToolListMemory,
    parsed_size,
)

log = logging.getLogger(__name__)

MODERN_PROTOCOL_VERSION: Final = "2026-07-28"
HANDSHAKE_PROTOCOL_VERSION: Final = "2025-11-25"
HANDSHAKE_PROTOCOL_VERSIONS: Final = frozenset(
    {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"}
)
CLIENT_INFO: Final[Mapping[str, str]] = {"name": "mcp-gateway", "version": "0.1.0"}

# JSON-RPC codes this client reacts to (2026-07-28 additions).
HEADER_MISMATCH: Final = -32020
UNSUPPORTED_PROTOCOL_VERSION: Final = -32022

_META_PROTOCOL_VERSION: Final = "io.modelcontextprotocol/protocolVersion"
_META_CLIENT_INFO: Final = "io.modelcontextprotocol/clientInfo"
_META_CLIENT_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"
_NAME_BEARING: Final[Mapping[str, str]] = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
}
_POST_ACCEPT: Final = "application/json, text/event-stream"
_MAX_MESSAGE_BYTES: Final = 32 * 1024 * 1024
_MAX_ERROR_BODY_BYTES: Final = 64 * 1024
_MAX_PAGES: Final = 100
_MAX_IDLE_RESUMES: Final = 2
_DEFAULT_RETRY_MS: Final = 1000
_MAX_RETRY_MS: Final = 5000
_CLOSE_TIMEOUT: Final = 3.0
_LEGACY_PROBE_TIMEOUT: Final = 5.0
_LEGACY_PROBE_BYTES: Final = 64 * 1024
ConnectMode = Literal["auto", "legacy"]


class ListReader:
    """Reads the pages of one tool list within the list's bounds, its hold growing as it goes."""

    def __init__(self, hold: ToolListHold) -> None:
        self.hold = hold
        self.received = 0  # bytes of every page so far
        self._page = 0  # what the page being read holds (raw bytes, weighted)

    async def take(self, resp: aiohttp.ClientResponse, nbytes: int, weight: int = 1) -> None:
        """Count `nbytes` just received; past the bound the connection is dropped, unread."""
        self.received += nbytes
        if self.received > MAX_TOOL_LIST_BYTES:
            resp.close()
            raise ToolListTooLarge(f"the tool list exceeds {MAX_TOOL_LIST_BYTES // MiB} MiB")
        self._page += nbytes * weight
        await self.hold.grow(nbytes * weight)

    async def read_body(self, resp: aiohttp.ClientResponse) -> bytearray:
        announced = resp.content_length
        if announced is not None and self.received + announced > MAX_TOOL_LIST_BYTES:
            resp.close()
            raise ToolListTooLarge(f"the tool list exceeds {MAX_TOOL_LIST_BYTES // MiB} MiB")
        body = bytearray()
        async for chunk in resp.content.iter_any():
            await self.take(resp, len(chunk))
            body += chunk
        return body

    async def parse(self, raw: bytes | bytearray | str, what: str) -> Any:
        # Grown first: a page too costly to parse is refused before it takes the memory (and
        # the event loop's time, which parsing takes in proportion).
        await self.hold.grow(parsed_size(raw))
        return _decode(raw, what)

    def page_done(self) -> None:
        self.hold.shrink(self._page)
        self._page = 0


class _SessionExpiredError(Exception):
    """The upstream forgot our session (404 to a request that carried Mcp-Session-Id)."""


class McpClient:
    """One logical MCP connection to an upstream; use as `async with McpClient(...) as client`.

    `headers` carry the upstream's credentials and are sent on every request, never logged.
    `timeout` bounds each HTTP exchange (request plus the whole response or SSE stream).
    `mode="auto"` tries 2026-07-28 `server/discover` first and falls back to the
    `initialize` handshake; `mode="legacy"` goes straight to the handshake.
    Tool lists are read within `memory` (the process's, shared by every client; without one,
    only each list's own bounds hold), on behalf of `owner`.
    Not meant for concurrent use by several tasks.
    """

    def __init__(
        self,
        http: aiohttp.ClientSession,
        url: str,
        headers: Mapping[str, str],
        timeout: float,
        *,
        mode: ConnectMode = "auto",
        memory: ToolListMemory | None = None,
        owner: Hashable = None,
    ) -> None:
        self._http = http
        self._memory = memory or ToolListMemory()
        self._owner = owner
        self._url = url
        self._headers: CIMultiDict[str] = CIMultiDict(
            (name, value) for name, value in headers.items() if name.lower() not in MANAGED_HEADERS
        )
        self._timeout = timeout
        self._mode = mode
        self._next_id = 0
        self._modern = False
        self._protocol_version: str | None = None
        self._session_id: str | None = None
        self._server_info: dict[str, Any] | None = None
        self._capabilities: dict[str, Any] | None = None
        # Each listed tool's inputSchema, and the Mcp-Param-* headers read from it on first use.
        self._schemas: dict[str, Any] = {}
        self.param_headers: dict[str, dict[tuple[str, ...], str]] = {}
        self._where = host_of(url)

    async def __aenter__(self) -> Self:
        try:
            await self.connect()
        except BaseException:
            # A handshake that failed after initialize still left a session upstream.
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def protocol_version(self) -> str | None:
        """The negotiated protocol version, once connected."""
        return self._protocol_version

    @property
    def session_id(self) -> str | None:
        """The upstream's `Mcp-Session-Id`, when the handshake issued one."""
        return self._session_id

    @property
    def server_info(self) -> dict[str, Any] | None:
        """The upstream's self-reported implementation (name, version), when it sent one."""
        return self._server_info

    @property
    def capabilities(self) -> dict[str, Any] | None:
        """The upstream's advertised capabilities."""
        return self._capabilities

    async def connect(self) -> None:
        """Pick the era: `server/discover` first (unless legacy mode), else the handshake."""
        if self._mode == "auto" and await self._discover():
            return
        await self._handshake()

    async def close(self) -> None:
        """End the upstream session, if one was issued; failures only get a debug line."""
        session_id, self._session_id = self._session_id, None
        if session_id is None:
            return
        await end_session(
            self._http,
            self._url,
            self._base_headers(),
            session_id,
            self._protocol_version,
            min(self._timeout, _CLOSE_TIMEOUT),
        )

    def keep_session(self) -> tuple[str | None, str | None]:
        """(protocol version, session id) of the connected upstream, which close() will then
        leave open: for a caller that goes on using the session without this client (a
        toolset keeps its members' sessions inside its own session id)."""
        session_id, self._session_id = self._session_id, None
        return self._protocol_version, session_id

    async def list_tools(self, hold: ToolListHold | None = None) -> list[dict[str, Any]]:
        """Every tool of the upstream, following `nextCursor` to the last page.

        Bounded in total (MAX_TOOL_LIST_BYTES over every page, MAX_TOOLS tools, and the
        memory it takes): past a bound, reading stops and `ToolListTooLarge` is raised. The
        memory is held in `hold` if one is given (the caller releases it once done with the
        list), else only while listing.
        """
        own = hold is None
        reader = ListReader(self._memory.hold(self._owner) if hold is None else hold)
        try:
            return await self._list_tools(reader)
        finally:
            if own:
                reader.hold.release()

    async def _list_tools(self, reader: ListReader) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(_MAX_PAGES):
            params = {"cursor": cursor} if cursor else {}
            result = await self._request("tools/list", params, reader)
            page = result.get("tools")
            if not isinstance(page, list) or not all(isinstance(tool, dict) for tool in page):
                raise McpResponseError("tools/list result has no list of tool objects")
            if len(tools) + len(page) > MAX_TOOLS:
                raise ToolListTooLarge(f"the tool list has more than {MAX_TOOLS:,} tools")
            tools.extend(page)
            next_cursor = result.get("nextCursor")
            if not next_cursor:
                break
            if not isinstance(next_cursor, str) or next_cursor in seen:
                raise McpResponseError(
                    f"tools/list returned a bad or repeated cursor {next_cursor!r}"
                )
            seen.add(next_cursor)
            cursor = next_cursor
        else:
            raise McpResponseError(f"tools/list did not finish within {_MAX_PAGES} pages")
        self._schemas = {
            tool["name"]: tool.get("inputSchema")
            for tool in tools
            if isinstance(tool.get("name"), str)
        }
        self.param_headers = {}
        return tools

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Call a tool and return the raw JSON-RPC `result` (check its `isError` yourself);
        `meta` goes in the request's `_meta` (a trace context, where the SDK's servers read
        it)."""
        params: dict[str, Any] = {"name": name, "arguments": dict(arguments or {})}
        if meta:
            params["_meta"] = dict(meta)
        try:
            return await self._request("tools/call", params)
        except McpRpcError as exc:
            if not (self._modern and exc.code == HEADER_MISMATCH):
                raise
        # 2026-07-28 servers demand Mcp-Param-* headers declared in the tool's schema,
        # which we only know after listing; list once and retry, as the SDK client does.
        await self.list_tools()
        return await self._request("tools/call", params)

    async def _discover(self) -> bool:
        """Try the 2026-07-28 era; False means the upstream refused and wants the handshake."""
        self._modern, self._protocol_version = True, MODERN_PROTOCOL_VERSION
        try:
            result, _ = await self._exchange("server/discover", {})
        except McpRpcError as exc:
            if exc.code == UNSUPPORTED_PROTOCOL_VERSION and not _offers_handshake(exc.data):
                raise
            refusal = str(exc)
        except McpHttpError as exc:
            if exc.status in (401, 403, 407):
                raise  # credentials, not an era verdict: the handshake would fail the same way
            refusal = str(exc)
        except McpResponseError as exc:
            refusal = str(exc)
        else:
            versions = result.get("supportedVersions")
            if isinstance(versions, list) and MODERN_PROTOCOL_VERSION in versions:
                capabilities = result.get("capabilities")
                self._capabilities = capabilities if isinstance(capabilities, dict) else {}
                meta = result.get("_meta")
                info = (
                    meta.get("io.modelcontextprotocol/serverInfo")
                    if isinstance(meta, dict)
                    else None
                )
                self._server_info = info if isinstance(info, dict) else None
                return True
            refusal = f"server/discover offers only {versions!r}"
        log.debug(
            "server/discover refused (%s), doing the handshake",
            refusal,
            extra={"upstream": self._where},
        )
        self._modern, self._protocol_version = False, None
        return False

    async def _handshake(self) -> None:
        self._modern, self._protocol_version, self._session_id = False, None, None
        params = {
            "protocolVersion": HANDSHAKE_PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": dict(CLIENT_INFO),
        }
        try:
            result, session_id = await self._exchange("initialize", params)
        except McpHttpError as exc:
            if exc.status in (400, 404, 405) and await self._is_legacy_sse():
                raise UnsupportedTransport() from exc
            raise
        version = result.get("protocolVersion")
        if not isinstance(version, str) or not version:
            raise McpResponseError("initialize result has no protocolVersion")
        self._protocol_version, self._session_id = version, session_id
        capabilities, info = result.get("capabilities"), result.get("serverInfo")
        self._capabilities = capabilities if isinstance(capabilities, dict) else {}
        self._server_info = info if isinstance(info, dict) else None
        await self._notify("notifications/initialized")

    async def _request(
        self, method: str, params: dict[str, Any], reader: ListReader | None = None
    ) -> dict[str, Any]:
        """One request after connecting; a single fresh handshake if the session expired."""
        try:
            result, _ = await self._exchange(method, params, reader)
            return result
        except _SessionExpiredError:
            log.info("MCP session expired, handshaking again", extra={"upstream": self._where})
        await self._handshake()
        try:
            result, _ = await self._exchange(method, params, reader)
        except _SessionExpiredError:
            raise McpHttpError(
                404, "Not Found", "session expired again right after a new handshake"
            ) from None
        return result

    async def _exchange(
        self, method: str, params: dict[str, Any], reader: ListReader | None = None
    ) -> tuple[dict[str, Any], str | None]:
        """POST one request; return its result and the `Mcp-Session-Id` of the response.

        With a `reader`, the response is a page of a tool list, read within its bounds."""
        self._next_id += 1
        request_id = self._next_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if self._modern:
            params = {**params, "_meta": {**params.get("_meta", {}), **self._envelope()}}
        if params:
            message["params"] = params
        headers = self._post_headers(method, params)
        body = orjson.dumps(message)
        async with (
            self._guard(),
            self._http.post(self._url, data=body, headers=headers, allow_redirects=False) as resp,
        ):
            if resp.status == 404 and self._session_id is not None:
                raise _SessionExpiredError()
            if not 200 <= resp.status < 300:
                raise await self._status_error(resp, request_id)
            if resp.content_type == "text/event-stream":
                reply = await self._read_sse(resp, request_id, reader)
            elif resp.content_type == "application/json" or resp.content_type.endswith("+json"):
                if reader is None:
                    reply = _decode(await _read_capped(resp, _MAX_MESSAGE_BYTES), "response body")
                else:
                    reply = await reader.parse(await reader.read_body(resp), "response body")
            else:
                raise McpResponseError(
                    f"unexpected Content-Type {resp.content_type!r} for {method}"
                )
            if reader is not None:
                reader.page_done()
            return _result_of(reply, request_id), resp.headers.get("Mcp-Session-Id")

    async def _notify(self, method: str) -> None:
        message = {"jsonrpc": "2.0", "method": method}
        headers = self._post_headers(method, {})
        async with (
            self._guard(),
            self._http.post(
                self._url, data=orjson.dumps(message), headers=headers, allow_redirects=False
            ) as resp,
        ):
            if not 200 <= resp.status < 300:
                raise McpHttpError(resp.status, resp.reason, f"upstream refused {method}")

    async def _read_sse(
        self, resp: aiohttp.ClientResponse, request_id: int, reader: ListReader | None
    ) -> Any:
        """The answer to `request_id` from an SSE stream; resumes with Last-Event-ID if cut off."""
        parser = SseParser(_MAX_MESSAGE_BYTES)
        reply = await _scan_sse(resp, parser, request_id, reader)
        last_id, retry_ms, idle = parser.last_event_id, parser.retry_ms, 0
        # 2025-11-25 servers may end a POST's stream early (polling) and expect a GET to resume it.
        while reply is None:
            if last_id is None or self._session_id is None or idle >= _MAX_IDLE_RESUMES:
                raise McpResponseError("the SSE stream ended before the response arrived")
            await asyncio.sleep(min(retry_ms or _DEFAULT_RETRY_MS, _MAX_RETRY_MS) / 1000)
            headers = self._base_headers()
            headers.update({"Accept": "text/event-stream", "Last-Event-ID": last_id})
            headers["Mcp-Session-Id"] = self._session_id
            if self._protocol_version is not None:
                headers["MCP-Protocol-Version"] = self._protocol_version
            async with self._http.get(self._url, headers=headers, allow_redirects=False) as again:
                if not 200 <= again.status < 300:
                    raise McpHttpError(again.status, again.reason, "resuming the SSE stream failed")
                if again.content_type != "text/event-stream":
                    raise McpResponseError("resuming the SSE stream did not return an event stream")
                parser = SseParser(_MAX_MESSAGE_BYTES)
                reply = await _scan_sse(again, parser, request_id, reader)
            idle = 0 if parser.last_event_id not in (None, last_id) else idle + 1
            last_id = parser.last_event_id or last_id
            retry_ms = parser.retry_ms or retry_ms
        return reply

    async def _status_error(self, resp: aiohttp.ClientResponse, request_id: int) -> McpError:
        if 300 <= resp.status < 400:
            # Never followed: the server's stored credentials must not travel to another
            # origin, and the registered URL is the one that is checked and shown.
            target = urlsplit(resp.headers.get("Location", "")).netloc.rpartition("@")[2]
            return McpHttpError(
                resp.status,
                resp.reason,
                f"redirects to {target or 'another URL'}; redirects are not followed: "
                "register the URL it points to",
            )
        body = await _read_capped(resp, _MAX_ERROR_BODY_BYTES, truncate=True)
        try:
            decoded = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            decoded = None
        if not isinstance(decoded, dict):
            return McpHttpError(resp.status, resp.reason)
        error = decoded.get("error")
        if isinstance(error, dict) and isinstance(error.get("code"), int):
            message = str(error.get("message", ""))
            # 2026-07-28 maps JSON-RPC error codes onto HTTP statuses: the error is the answer.
            if self._modern and decoded.get("id") in (request_id, None):
                return McpRpcError(error["code"], message, error.get("data"), resp.status)
            return McpHttpError(resp.status, resp.reason, message or None)
        text = next(
            (decoded[k] for k in ("detail", "error", "message") if isinstance(decoded.get(k), str)),
            "",
        )
        return McpHttpError(resp.status, resp.reason, text[:200] or None)

    async def _is_legacy_sse(self) -> bool:
        """Whether a GET yields the `endpoint` event of the 2024-11-05 HTTP+SSE transport."""
        headers = self._base_headers()
        headers["Accept"] = "text/event-stream"
        parser = SseParser(_LEGACY_PROBE_BYTES)
        try:
            async with (
                asyncio.timeout(min(self._timeout, _LEGACY_PROBE_TIMEOUT)),
                self._http.get(self._url, headers=headers, allow_redirects=False) as resp,
            ):
                if resp.status != 200 or resp.content_type != "text/event-stream":
                    return False
                received = 0
                async for chunk in resp.content.iter_any():
                    events = parser.feed(chunk)
                    if events:
                        return events[0].event == "endpoint"
                    received += len(chunk)
                    if received > _LEGACY_PROBE_BYTES:
                        return False
        except (TimeoutError, aiohttp.ClientError, SseError):
            return False
        return False

    @contextlib.asynccontextmanager
    async def _guard(self) -> AsyncIterator[None]:
        """Bound one exchange by the timeout and turn transport failures into `McpError`s."""
        try:
            async with asyncio.timeout(self._timeout):
                yield
        except aiohttp.ConnectionTimeoutError as exc:
            raise McpTimeoutError(f"connecting to {self._where} timed out") from exc
        except aiohttp.SocketTimeoutError as exc:
            raise McpTimeoutError(f"reading from {self._where} timed out") from exc
        except TimeoutError as exc:
            raise McpTimeoutError(f"timed out after {self._timeout:g} s") from exc
        except aiohttp.ClientError as exc:
            raise _connection_error(exc, self._where) from exc
        except UnicodeError as exc:  # a host name IDNA cannot encode (stored before it was checked)
            raise McpConnectionError("invalid upstream URL") from exc
        except SseError as exc:
            raise McpResponseError(str(exc)) from exc

    def _header_map(self, name: str) -> dict[tuple[str, ...], str]:
        # Read from the schema when first needed: walking every schema of a large list at
        # once would hold the event loop for nothing.
        found = self.param_headers.get(name)
        if found is None:
            found = param_header_map(self._schemas.get(name))
            self.param_headers[name] = found
        return found

    def _envelope(self) -> dict[str, Any]:
        return {
            _META_PROTOCOL_VERSION: self._protocol_version,
            _META_CLIENT_INFO: dict(CLIENT_INFO),
            _META_CLIENT_CAPABILITIES: {},
        }

    def _base_headers(self) -> CIMultiDict[str]:
        headers = self._headers.copy()
        # The shared session may not decompress (the proxy streams bytes through untouched).
        headers["Accept-Encoding"] = "identity"
        return headers

    def _post_headers(self, method: str, params: Mapping[str, Any]) -> CIMultiDict[str]:
        headers = self._base_headers()
        headers["Accept"] = _POST_ACCEPT
        headers["Content-Type"] = "application/json"
        if self._protocol_version is not None and method != "initialize":
            headers["MCP-Protocol-Version"] = self._protocol_version
        if self._session_id is not None:
            headers["Mcp-Session-Id"] = self._session_id
        if self._modern:
            headers["Mcp-Method"] = method
            name_key = _NAME_BEARING.get(method)
            name = params.get(name_key) if name_key else None
            if isinstance(name, str):
                headers["Mcp-Name"] = header_value(name)
            arguments = params.get("arguments")
            if method == "tools/call" and isinstance(name, str) and isinstance(arguments, Mapping):
                headers.update(param_headers(self._header_map(name), arguments))
        return headers


async def end_session(
    http: aiohttp.ClientSession,
    url: str,
    headers: CIMultiDict[str],
    session_id: str,
    protocol_version: str | None,
    timeout: float,  # noqa: ASYNC109 -- a DELETE nobody waits long for
) -> None:
    """DELETE an upstream session (`headers`: the server's credentials); failures only get a
    debug line: the session then ends when the server expires it."""
    headers = headers.copy()
    headers["Mcp-Session-Id"] = session_id
    headers["Accept-Encoding"] = "identity"
    if protocol_version is not None:
        headers["MCP-Protocol-Version"] = protocol_version
    where = host_of(url)
    try:
        async with (
            asyncio.timeout(timeout),
            http.delete(url, headers=headers, allow_redirects=False) as resp,
        ):
            log.debug("MCP session closed", extra={"upstream": where, "status": resp.status})
    except (TimeoutError, aiohttp.ClientError) as exc:
        log.debug("MCP session DELETE failed: %s", type(exc).__name__, extra={"upstream": where})


async def _scan_sse(
    resp: aiohttp.ClientResponse, parser: SseParser, request_id: int, reader: ListReader | None
) -> Any:
    """Read events until the one answering `request_id`; None if the stream ends first."""
    async for chunk in resp.content.iter_any():
        if reader is not None:
            # Held twice until parsed: in the parser's buffer, and as the event's text.
            await reader.take(resp, len(chunk), weight=2)
        for event in parser.feed(chunk):
            # Empty priming events and non-message events carry nothing for us.
            if event.event != "message" or not event.data.strip():
                continue
            if reader is None:
                message = _decode(event.data.encode(), "SSE event")
            else:
                message = await reader.parse(event.data, "SSE event")
            # Progress and log notifications, and server-to-client requests, are skipped.
            if (
                isinstance(message, dict)
                and message.get("id") == request_id
                and ("result" in message or "error" in message)
            ):
                return message
    return None


async def _read_capped(
    resp: aiohttp.ClientResponse, limit: int, *, truncate: bool = False
) -> bytes:
    if not truncate and resp.content_length is not None and resp.content_length > limit:
        raise McpResponseError(f"body of {resp.content_length} bytes exceeds {limit}")
    body = bytearray()
    async for chunk in resp.content.iter_any():
        body += chunk
        if len(body) > limit:
            if truncate:
                return bytes(body[:limit])
            raise McpResponseError(f"body exceeds {limit} bytes")
    return bytes(body)


def _decode(raw: bytes | bytearray | str, what: str) -> Any:
    if not raw.strip():
        raise McpResponseError(f"empty {what}")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise McpResponseError(f"{what} is not JSON") from None


def _result_of(reply: Any, request_id: int) -> dict[str, Any]:
    if not isinstance(reply, dict):
        raise McpResponseError("expected a JSON-RPC response object")
    error = reply.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        if not isinstance(code, int):
            raise McpResponseError("JSON-RPC error without an integer code")
        raise McpRpcError(code, str(error.get("message", "")), error.get("data"))
    if reply.get("id") != request_id:
        raise McpResponseError(
            f"response id {reply.get('id')!r} does not match request id {request_id}"
        )
    result = reply.get("result")
    if not isinstance(result, dict):
        raise McpResponseError("JSON-RPC response has no result object")
    return result


def _offers_handshake(data: Any) -> bool:
    """Whether a -32022 error's `supported` list (if readable) leaves the handshake open."""
    supported = data.get("supported") if isinstance(data, dict) else None
    if not isinstance(supported, list):
        return True
    return any(version in HANDSHAKE_PROTOCOL_VERSIONS for version in supported)


def _connection_error(exc: aiohttp.ClientError, where: str) -> McpConnectionError:
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return McpConnectionError(f"DNS lookup failed for {where}")
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return McpConnectionError(f"TLS handshake with {where} failed")
    if isinstance(exc, aiohttp.ClientConnectorError):
        if exc.os_error.errno == errno.ECONNREFUSED:
            return McpConnectionError(f"connection refused by {where}")
        reason = exc.os_error.strerror or type(exc.os_error).__name__
        return McpConnectionError(f"cannot connect to {where}: {reason}")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return McpConnectionError(f"{where} closed the connection without answering")
    if isinstance(exc, aiohttp.ClientOSError) and exc.errno == errno.ECONNRESET:
        return McpConnectionError(f"connection reset by {where}")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return McpConnectionError(f"{where} broke off the response body")
    if isinstance(exc, aiohttp.InvalidURL):
        return McpConnectionError("invalid upstream URL")
    return McpConnectionError(f"connection to {where} failed: {type(exc).__name__}")
