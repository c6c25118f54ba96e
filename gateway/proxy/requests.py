"""The calls in a proxied request body, as the call log sees them: each `tools/call`, each
request about a task a call became (whose reply may be that call's end), and the refusal of a
body the gateway cannot read as any server would (so that no call runs unlogged, or under
another tool's name).

Real MCP servers are lenient in different ways: one decodes UTF-16, one matches keys
case-insensitively, one takes the first of two keys of a name. A body whose calls any of them
could read differently from the gateway is refused before it is forwarded.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, Final

import orjson

from gateway.calllog.records import clean_text

TOOLS_CALL: Final = "tools/call"
# Requests about a task a `tools/call` became (the tasks extension, and 2025-11-25's tasks):
# the reply to one of them may be that call's end (gateway/proxy/tasks).
TASK_METHODS: Final = frozenset({"tasks/get", "tasks/result", "tasks/cancel"})
UNNAMED_TOOL: Final = "(unnamed)"
MAX_TOOL_NAME: Final = 255
# The gateway's own refusals of a request body (JSON-RPC's codes), and the bounds behind them.
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
MAX_BATCH: Final = 100
MAX_DEPTH: Final = 64
# More arrays and objects than this in one body are refused before it is parsed: a body of
# tiny ones takes orjson ~0.4 µs each, and so holds the event loop.
MAX_CONTAINERS: Final = 100_000


class ToolCallSeen:
    """One `tools/call` of a request, or one request about the task a call became (`about`),
    and what its reply said about it."""

    __slots__ = (
        "about",
        "answered",
        "error",
        "handed",
        "interim",
        "name",
        "relayed",
        "rid",
        "task_id",
        "tasked",
        "ttl_ms",
    )

    def __init__(self, name: str, rid: Any) -> None:
        self.name = name
        # The JSON-RPC id; None for a call sent as a notification (nothing will answer it).
        self.rid = rid
        # Its response was read; `error` is why the call failed, according to it.
        self.answered = False
        self.error: str | None = None
        # Its response was read and handed to the caller.
        self.relayed = False
        # Its response is not the call's end: an `input_required` answer (the client retries
        # the call), a task handle, or a reply about a task that does not end it. No row.
        self.interim = False
        # None for a `tools/call`; else the request about a task (one of TASK_METHODS).
        self.about: str | None = None
        # The task the request is about, or the task the call's reply turned it into.
        self.task_id: str | None = None
        # Its reply is read whole whatever it looks like: it may concern a task.
        self.tasked = False
        # How long the server keeps the task (its handle's TTL), if it said.
        self.ttl_ms: int | None = None
        # Its row (or its room in the log) is in the hands of gateway.proxy.tasks.
        self.handed = False


class UnreadableRequest(Exception):
    """A request body the gateway refuses to forward, because it cannot be sure to see every
    `tools/call` in it as the server will: answered with a JSON-RPC error of `code`, never
    forwarded (forwarding it would let a call run unlogged, and past any rule on its name)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def tool_calls_in(body: bytes) -> list[ToolCallSeen]:
    """Each `tools/call` of a JSON-RPC message or batch, and each request about a task
    (TASK_METHODS) with its task id, [] for anything else.

    Raises UnreadableRequest for a body the gateway cannot be sure to read as any server
    would: not UTF-8 (UTF-16 and UTF-32 included: a lenient server decodes them, or invalid
    bytes, into a call the gateway never saw), nesting deeper than MAX_DEPTH, holding more
    than MAX_CONTAINERS arrays and objects, a batch of more than MAX_BATCH messages (each call
    is a row of the shared call log), a key that decides what is called (`method`, `params`,
    `name`) named twice in one object or in another letter case (some servers match keys
    case-insensitively), or a body that may hold a call but is not JSON. Every proxied body
    comes this way, so the usual ones cost little: one without `tools/call` a few byte scans
    (it is parsed only if it may be a batch, nest deeply, spell a call with escapes or name a
    task method), a compact one with it a parse and a serialisation.
    """
    # How many arrays and objects the body may hold (brackets in strings count too): fewer
    # than MAX_DEPTH cannot nest deeper than it, nor can a body too short to.
    containers = body.count(b"{") + body.count(b"[") if len(body) > _SHALLOW_BYTES else 0
    if body.find(b"tools/call") < 0:  # find(), not `in`: see replies._plain_result
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
            return _task_request(body) if body.find(b"tasks/") >= 0 else []
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
        method = message.get("method")
        if method == TOOLS_CALL:
            return [_seen(message)]
        return _about_task(message) if type(method) is str and method in TASK_METHODS else []
    if type(message) is not list:
        return []
    if len(message) > MAX_BATCH:
        raise UnreadableRequest(
            INVALID_REQUEST,
            f"Invalid Request: a batch holds at most {MAX_BATCH} messages, this one {len(message)}",
        )
    _refuse_unclear_keys(body, batch=True)  # batches are rare: each is looked at key by key
    seen: list[ToolCallSeen] = []
    for item in message:
        method = item.get("method") if type(item) is dict else None
        if method == TOOLS_CALL:
            seen.append(_seen(item))
        elif type(method) is str and method in TASK_METHODS:
            seen += _about_task(item)
    return seen


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
        seen = ToolCallSeen(UNNAMED_TOOL, message.get("id"))
    else:
        if not name.isascii() or "\x00" in name:  # cleaned first: that may lengthen it
            name = clean_text(name) or UNNAMED_TOOL
        seen = ToolCallSeen(name[:MAX_TOOL_NAME] if name else UNNAMED_TOOL, message.get("id"))
    if isinstance(params, dict) and "task" in params:
        # 2025-11-25's tasks: a call asking for one may be answered `{"task": {...}}`, a
        # result without `resultType` that only a parse tells from a final one.
        seen.tasked = True
    return seen


def _task_request(body: bytes) -> list[ToolCallSeen]:
    """A plain body that names a task method: what it asks about, if it is such a request.
    Nothing here decides what runs, so nothing is refused: a body that does not parse is
    only not followed."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return []
    if type(message) is not dict:
        return []
    method = message.get("method")
    return _about_task(message) if type(method) is str and method in TASK_METHODS else []


def _about_task(message: dict[str, Any]) -> list[ToolCallSeen]:
    """A request about a task (TASK_METHODS): one entry whose reply may end the call the task
    stands for; none for a notification or a request without a task id."""
    params = message.get("params")
    task_id = params.get("taskId") if type(params) is dict else None
    rid = message.get("id")
    if type(task_id) is not str or rid is None:
        return []
    seen = ToolCallSeen(UNNAMED_TOOL, rid)
    seen.about = message["method"]
    seen.task_id = task_id
    seen.tasked = True
    seen.interim = True  # until its reply is read and ends the task
    return [seen]
