"""`tools/call` as the call log sees it: the calls in a request body, and each one's outcome.

Real MCP servers report failures inside HTTP 200: a JSON-RPC `error` for a bad request, a
result with `isError: true` for a tool that failed. The proxy forwards every byte unchanged and
reads alongside, only for requests that carry a `tools/call`: the request body once, the reply
as it is relayed (one JSON body, or the SSE events until the awaited responses have passed).
"""

from __future__ import annotations

import json
import time
from typing import Any, Final

import orjson

from gateway.calllog import clean_text
from gateway.mcp.sse import SseError, SseParser

TOOLS_CALL: Final = "tools/call"
UNNAMED_TOOL: Final = "(unnamed)"
MAX_TOOL_NAME: Final = 255
# error_message is a reason to read, not a copy of the reply.
MAX_ERROR_CHARS: Final = 1000
# A reply (or one SSE event) larger than this is relayed without being read: its calls are
# judged by the HTTP status alone. Errors are small; only results grow this large.
MAX_JUDGED_BYTES: Final = 4 << 20

# The gateway's own refusals of a request body (JSON-RPC's codes), and the bounds behind them.
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
MAX_BATCH: Final = 100
MAX_DEPTH: Final = 64

CALLER_CANCELLED: Final = "cancelled by the caller"
# The error a 2025-era SDK server answers a request with once the client cancelled it
# (LSP's RequestCancelled; 2026-07-28 servers send nothing and the client hangs up instead).
_REQUEST_CANCELLED: Final = -32800


class ToolCallSeen:
    """One `tools/call` of a request, and what its reply said about it."""

    __slots__ = ("answered", "error", "name", "relayed", "rid")

    def __init__(self, name: str, rid: Any) -> None:
        self.name = name
        # The JSON-RPC id; None for a call sent as a notification (nothing will answer it).
        self.rid = rid
        # Its response was read; `error` is why the call failed, according to it.
        self.answered = False
        self.error: str | None = None
        # Its response was read and handed to the caller.
        self.relayed = False


def _loads(body: bytes | str) -> Any:
    """orjson, or where it refuses the standard library's json, which also takes what some MCP
    servers accept (NaN, lone surrogates, a BOM): a call such a server runs is still seen."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


class UnreadableRequest(Exception):
    """A request body the gateway refuses to forward, because it cannot be sure to see every
    `tools/call` in it as the server will: answered with a JSON-RPC error of `code`, never
    forwarded (forwarding it would let a call run unlogged, and past any rule on its name)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def tool_calls_in(body: bytes) -> list[ToolCallSeen]:
    """Each `tools/call` of a JSON-RPC message or batch, [] for anything else.

    Raises UnreadableRequest for a body that is not valid UTF-8 (a lenient server may decode
    it into a call the gateway never saw), nests deeper than MAX_DEPTH, is a batch of more
    than MAX_BATCH messages (each call is a row of the shared call log), names a key that
    decides what is called twice in one object, or may hold a call but is not JSON the
    gateway can read. Every proxied body comes this way, so the usual ones cost little: a body
    without `tools/call` a few byte scans (it is parsed only if it may be a batch, nest deeply
    or spell a call with escapes), a compact one with it a parse and a serialisation.
    """
    if b"tools/call" in body:
        message = _parse(body)  # orjson checks the UTF-8
        deep = len(body) > _SHALLOW_BYTES and _may_nest_deeply(body)
    else:
        if not body.isascii():  # a flag check: most bodies are ASCII
            _refuse_invalid_utf8(body)
        # Letters can be escaped only as \uXXXX and the slash also as \/: without either, a
        # `tools/call` method and every key show literally (a text's \n or \" changes nothing).
        escaped = b"\\" in body and (b"\\u" in body or b"\\/" in body)
        batch = body[0] != _OPEN_BRACE and body.lstrip()[:1] == b"["
        deep = _may_nest_deeply(body)
        if not (escaped or batch or deep):
            return []
        message = _parse(body)
    if deep and _deeper_than(message, MAX_DEPTH):
        raise UnreadableRequest(PARSE_ERROR, _TOO_DEEP)
    batch = type(message) is list
    if batch and len(message) > MAX_BATCH:
        raise UnreadableRequest(
            INVALID_REQUEST,
            f"Invalid Request: a batch holds at most {MAX_BATCH} messages, this one {len(message)}",
        )
    try:
        canonical = orjson.dumps(message) == body
    except orjson.JSONEncodeError:  # a lone surrogate, read by the lenient parse
        canonical = False
    if not canonical:
        # Not spelled as orjson writes it (whitespace, escapes, or a key named twice, which
        # the parse dropped): the deciding keys are counted, and checked one by one if need be.
        _refuse_repeated_deciding_keys(body, message)
    if not batch:
        is_call = type(message) is dict and message.get("method") == TOOLS_CALL
        return [_seen(message)] if is_call else []
    return [_seen(m) for m in message if type(m) is dict and m.get("method") == TOOLS_CALL]


_OPEN_BRACE = ord("{")
# The shortest body nesting deeper than MAX_DEPTH: its brackets alone.
_SHALLOW_BYTES = 2 * (MAX_DEPTH + 1) - 1
_TOO_DEEP = f"Parse error: the body nests deeper than {MAX_DEPTH} levels"
# Keys that decide what is called: named twice, a server that takes the first would call what
# the gateway (which, like orjson, takes the last) never saw.
_DECIDING_KEYS = (b'"method"', b'"params"', b'"name"')


def _refuse_invalid_utf8(body: bytes) -> None:
    try:
        body.decode()
    except UnicodeDecodeError:
        raise UnreadableRequest(PARSE_ERROR, "Parse error: the body is not valid UTF-8") from None


def _parse(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return _parse_leniently(body, exc)


def _parse_leniently(body: bytes, refusal: orjson.JSONDecodeError) -> Any:
    """What orjson refused: not UTF-8, too deep, or JSON that some MCP servers accept (NaN,
    lone surrogates, a BOM), read by the standard library so a call such a server runs is
    seen."""
    _refuse_invalid_utf8(body)
    if str(refusal).startswith(("depth limit", "recursion")):
        raise UnreadableRequest(PARSE_ERROR, _TOO_DEEP)
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise UnreadableRequest(PARSE_ERROR, "Parse error: the body is not JSON") from None


def _may_nest_deeply(body: bytes) -> bool:
    """Whether the body has the bytes and the brackets to nest deeper than MAX_DEPTH."""
    return len(body) > _SHALLOW_BYTES and body.count(b"{") + body.count(b"[") > MAX_DEPTH


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels (without recursion: the
    body may nest as deep as orjson goes)."""
    if type(value) is not dict and type(value) is not list:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        for child in node.values() if type(node) is dict else node:
            if type(child) is dict or type(child) is list:
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _refuse_repeated_deciding_keys(body: bytes, message: Any) -> None:
    messages = len(message) if type(message) is list else 1
    if b"\\u" in body or any(body.count(key) > messages for key in _DECIDING_KEYS):
        _refuse_duplicate_keys(body)


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        names = [key for key, _ in pairs]
        twice = next(key for key in names if names.count(key) > 1)
        raise _DuplicateKey(f"the key {twice!r} is named twice in one object")
    return found


def _refuse_duplicate_keys(body: bytes) -> None:
    try:
        json.loads(body, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise UnreadableRequest(PARSE_ERROR, f"Parse error: {exc}") from None
    except (ValueError, RecursionError):
        pass  # parsed above (orjson): only the standard library's limits differ


def _seen(message: dict[str, Any]) -> ToolCallSeen:
    params = message.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    if not isinstance(name, str):
        return ToolCallSeen(UNNAMED_TOOL, message.get("id"))
    if not name.isascii() or "\x00" in name:  # cleaned first: that may lengthen it
        name = clean_text(name) or UNNAMED_TOOL
    return ToolCallSeen(name[:MAX_TOOL_NAME] if name else UNNAMED_TOOL, message.get("id"))


def shorten(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def rpc_error_text(error: dict[str, Any]) -> str:
    """A JSON-RPC error object as a reason: `JSON-RPC error <code>: <message>`."""
    text = f"JSON-RPC error {error.get('code')}: {error.get('message', '')}"
    if error.get("code") == _REQUEST_CANCELLED:
        text = f"{CALLER_CANCELLED} (the server confirmed: {text})"
    return shorten(text)


def failed_result_text(result: dict[str, Any]) -> str:
    """What a tool that returned `isError: true` said: the text of its content blocks."""
    content = result.get("content")
    blocks = content if isinstance(content, list) else []
    texts = [
        block["text"]
        for block in blocks
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    ]
    return shorten("\n".join(texts) or "the tool reported an error without a text")


def _response(message: Any) -> tuple[Any, str | None] | None:
    """(id, why the call failed or None) of a JSON-RPC response; None for any other message
    (a notification, a request from the server, something else)."""
    if type(message) is not dict:
        return None
    error = message.get("error")
    if type(error) is dict:
        return message.get("id"), rpc_error_text(error)
    if "result" not in message:
        return None
    result = message["result"]
    if type(result) is dict and result.get("isError") is True:
        return message.get("id"), failed_result_text(result)
    return message.get("id"), None


def _answers(response_id: Any, reason: str | None, rid: Any) -> bool:
    # 1 and "1" (and True) are different ids. A refusal without an id (parse error, invalid
    # request) answers every call of the request.
    return (response_id == rid and type(response_id) is type(rid)) or (
        response_id is None and reason is not None
    )


def read_reply(calls: list[ToolCallSeen], body: bytes) -> None:
    """A whole JSON reply (one response, or a batch of them): marks the calls it answers."""
    if len(calls) == 1:  # the usual case, without the bookkeeping
        call = calls[0]
        if _plain_result(body):
            call.answered = True
            return
        message = _loads(body) if body else None
        response = _response(message)
        if response is not None and _answers(*response, call.rid):
            call.answered, call.error = True, response[1]
        return
    message = _loads(body) if body else None
    waiting = _Waiting(calls)
    waiting.read(message)


def _plain_result(body: bytes) -> bool:
    """Whether a reply to one call is a result that cannot be a failure, seen without parsing
    it (most replies): a JSON-RPC error needs an `"error"` key and a failed result `true`, a
    literal no escape can spell; a backslash might hide the key, so such bodies are parsed.
    (A result for another id would pass for ours: only a broken server sends one.)"""
    return (
        body[:1] == b"{"
        and b'"result"' in body
        and b'"error"' not in body
        and b"true" not in body
        and b"\\" not in body
    )


def _key(rid: Any) -> tuple[type, Any] | None:
    """A dict key for an id; None for an id no response can be matched to (not a JSON scalar)."""
    return (type(rid), rid) if isinstance(rid, str | int | float) else None


class _Waiting:
    """The calls of a request not answered yet, by id (a batch may hold thousands)."""

    __slots__ = ("by_id", "read_now")

    def __init__(self, calls: list[ToolCallSeen]) -> None:
        self.by_id: dict[tuple[type, Any], list[ToolCallSeen]] = {}
        for call in calls:
            key = _key(call.rid)
            if key is not None:
                self.by_id.setdefault(key, []).append(call)
        # Answered by what was read since the last look.
        self.read_now: list[ToolCallSeen] = []

    def read(self, message: Any) -> None:
        if isinstance(message, list):  # a batch (only its top level: responses do not nest)
            for item in message:
                self._judge(item)
        else:
            self._judge(message)

    def _judge(self, message: Any) -> None:
        response = _response(message)
        if response is None:
            return
        response_id, reason = response
        if response_id is None and reason is not None:
            calls = [call for waiting in self.by_id.values() for call in waiting]
            self.by_id.clear()
        else:
            key = _key(response_id)
            calls = [] if key is None else self.by_id.pop(key, [])
        for call in calls:
            call.answered, call.error = True, reason
        self.read_now += calls


class ReplyReader:
    """Finds the responses to a request's `tools/call`s in a streamed reply while it is relayed.

    The proxy hands it every chunk before writing it to the caller (`feed`) and says when the
    write succeeded (`delivered`): a call's outcome is settled once its response reached the
    caller, whatever happens to the connection afterwards.
    """

    __slots__ = ("_body", "_sse", "_waiting", "answered_at", "blind", "resumable")

    def __init__(self, calls: list[ToolCallSeen], *, event_stream: bool) -> None:
        self._waiting = _Waiting(calls)
        self._sse = SseParser(MAX_JUDGED_BYTES) if event_stream else None
        # A streamed JSON reply, gathered until it ends.
        self._body: bytearray | None = None
        # perf_counter() when the last awaited response reached the caller.
        self.answered_at: float | None = None
        # Part of the reply could not be read (too large, or a broken event stream): calls
        # without a response are judged by the HTTP status alone.
        self.blind = False
        # The stream carried event ids: an answer missing from it may come on a resumed stream.
        self.resumable = False

    @property
    def done(self) -> bool:
        """Nothing left to look for: the rest of the reply is relayed without being read."""
        return not self._waiting.by_id or self.blind

    def feed(self, chunk: bytes) -> None:
        """The next chunk of the reply, before it is written to the caller."""
        if self.done:
            return
        if self._sse is None:
            if self._body is None:
                self._body = bytearray()
            self._body += chunk
            if len(self._body) > MAX_JUDGED_BYTES:
                self._give_up()
            return
        try:
            events = self._sse.feed(chunk)
        except SseError:
            self._give_up()
            return
        if self._sse.last_event_id is not None:
            self.resumable = True
        for event in events:
            # Priming events are empty; progress and log notifications are read and skipped.
            if event.data:
                self._waiting.read(_loads(event.data))
                if not self._waiting.by_id:
                    break

    def finish(self) -> None:
        """The reply ended (everything fed was written)."""
        if self._body is not None and not self.done:
            body, self._body = bytes(self._body), None
            self._waiting.read(_loads(body))

    def delivered(self) -> None:
        """Everything fed so far has been handed to the caller."""
        read_now = self._waiting.read_now
        if read_now:
            for call in read_now:
                call.relayed = True
            read_now.clear()
            if not self._waiting.by_id:
                self.answered_at = time.perf_counter()

    def _give_up(self) -> None:
        self.blind = True
        self._body = None
        self._sse = None
