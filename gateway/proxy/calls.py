"""`tools/call` as the call log sees it: the calls in a request body, and each one's outcome.

Real MCP servers report failures inside HTTP 200: a JSON-RPC `error` for a bad request, a
result with `isError: true` for a tool that failed. The proxy forwards every byte unchanged and
reads alongside, only for requests that carry a `tools/call`: the request body once, the reply
as it is relayed (one JSON body, or the SSE events until the awaited responses have passed).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from typing import Any, Final

import orjson

from gateway.calllog.writer import clean_text
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
# More arrays and objects than this in one body are refused before it is parsed: a body of
# tiny ones takes orjson ~0.4 µs each, and so holds the event loop.
MAX_CONTAINERS: Final = 100_000

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

    Raises UnreadableRequest for a body the gateway cannot be sure to read as any server
    would: not UTF-8 (UTF-16 and UTF-32 included: a lenient server decodes them, or invalid
    bytes, into a call the gateway never saw), nesting deeper than MAX_DEPTH, holding more
    than MAX_CONTAINERS arrays and objects, a batch of more than MAX_BATCH messages (each call
    is a row of the shared call log), a key that decides what is called (`method`, `params`,
    `name`) named twice in one object or in another letter case (some servers match keys
    case-insensitively), or a body that may hold a call but is not JSON. Every proxied body
    comes this way, so the usual ones cost little: one without `tools/call` a few byte scans
    (it is parsed only if it may be a batch, nest deeply or spell a call with escapes), a
    compact one with it a parse and a serialisation.
    """
    # How many arrays and objects the body may hold (brackets in strings count too): fewer
    # than MAX_DEPTH cannot nest deeper than it, nor can a body too short to.
    containers = body.count(b"{") + body.count(b"[") if len(body) > _SHALLOW_BYTES else 0
    if b"tools/call" not in body:
        # UTF-16 and UTF-32 (no BOM) put a NUL in one of the first two bytes of any JSON
        # text; with a BOM, or any other byte that is not ASCII, the body must be UTF-8.
        if not body[0] or (len(body) > 1 and not body[1]):
            raise UnreadableRequest(PARSE_ERROR, _NOT_UTF8)
        if not body.isascii():  # a flag check: most bodies are ASCII
            _refuse_invalid_utf8(body)
        # Letters can be escaped only as \uXXXX and the slash also as \/: without either, a
        # `tools/call` method and every key show literally (a text's \n or \" changes nothing).
        escaped = b"\\" in body and (b"\\u" in body or b"\\/" in body)
        batch = body[0] != _OPEN_BRACE and body.lstrip()[:1] == b"["
        if not (escaped or batch or containers > MAX_DEPTH):
            return []
    if containers > MAX_CONTAINERS:
        raise UnreadableRequest(PARSE_ERROR, _TOO_MANY_CONTAINERS)
    message = _parse(body)  # orjson checks the UTF-8
    if containers > MAX_DEPTH and _nests_deeper_than(body, MAX_DEPTH):
        raise UnreadableRequest(PARSE_ERROR, _TOO_DEEP)
    if type(message) is dict:
        try:
            canonical = orjson.dumps(message) == body
        except orjson.JSONEncodeError:  # a lone surrogate, read by the lenient parse
            canonical = False
        # Spelled as orjson writes what it read, no key can be repeated or escaped; then
        # only keys beyond the usual ones need a look (another letter case).
        params = message.get("params")
        if (
            not canonical
            or not message.keys() <= _MESSAGE_KEYS
            or (type(params) is dict and not params.keys() <= _PARAMS_KEYS)
        ):
            _refuse_unclear_keys(body, batch=False)
        return [_seen(message)] if message.get("method") == TOOLS_CALL else []
    if type(message) is not list:
        return []
    if len(message) > MAX_BATCH:
        raise UnreadableRequest(
            INVALID_REQUEST,
            f"Invalid Request: a batch holds at most {MAX_BATCH} messages, this one {len(message)}",
        )
    _refuse_unclear_keys(body, batch=True)  # batches are rare: each is looked at key by key
    return [_seen(m) for m in message if type(m) is dict and m.get("method") == TOOLS_CALL]


_OPEN_BRACE = ord("{")
_NOT_UTF8 = "Parse error: the body is not valid UTF-8"
_TOO_DEEP = f"Parse error: the body nests deeper than {MAX_DEPTH} levels"
_TOO_MANY_CONTAINERS = (
    f"Parse error: the body holds more than {MAX_CONTAINERS:,} arrays and objects"
)
# Keys that decide what is called: named twice (a server that takes the first calls what the
# gateway, which like orjson takes the last, never saw) or in another letter case (a server
# that matches keys case-insensitively, as Go's encoding/json does, reads them).
_DECIDING_KEYS = frozenset({"method", "params", "name"})
# The keys of a message and of its params that need no look beyond orjson's parse.
_MESSAGE_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_PARAMS_KEYS = frozenset({"name", "arguments", "_meta"})
# Strings (their brackets are not structure), and each bracket's step in depth.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


# The shortest body nesting deeper than MAX_DEPTH: its brackets alone.
_SHALLOW_BYTES = 2 * (MAX_DEPTH + 1) - 1


def _nests_deeper_than(body: bytes, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels, worked out on the bytes
    (strings removed, then the running depth of the brackets) at C speed: a Python walk of a
    parsed body of a hundred thousand containers would hold the event loop for a fifth of a
    second."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0) > limit


def _refuse_invalid_utf8(body: bytes) -> None:
    try:
        body.decode()
    except UnicodeDecodeError:
        raise UnreadableRequest(PARSE_ERROR, _NOT_UTF8) from None


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


def _refuse_unclear_keys(body: bytes, *, batch: bool) -> None:
    """Read the body again keeping every key as written (the standard library's parser with
    a C-level pairs hook, so no Python runs per object), and refuse a message or params
    object that names a deciding key twice or in another letter case."""
    try:
        raw = json.loads(body, object_pairs_hook=list)
    except (ValueError, RecursionError):
        return  # orjson read it; the standard library's limits are not the server's
    for message in raw if batch else [raw]:
        if not _is_object(message):
            continue
        _refuse_unclear_pairs(message)
        for key, value in message:
            if key == "params" and _is_object(value):
                _refuse_unclear_pairs(value)


def _is_object(value: Any) -> bool:
    """With the pairs hook an object is a list of (key, value) tuples; an array a list."""
    return type(value) is list and all(type(item) is tuple for item in value)


def _refuse_unclear_pairs(pairs: list[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for key, _ in pairs:
        folded = key.casefold()
        if folded not in _DECIDING_KEYS:
            continue
        if key != folded:
            raise UnreadableRequest(
                PARSE_ERROR, f"Parse error: the key {key!r} is {folded!r} in another letter case"
            )
        if key in seen:
            raise UnreadableRequest(
                PARSE_ERROR, f"Parse error: the key {key!r} is named twice in one object"
            )
        seen.add(key)


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
