"""The outcome of each proxied `tools/call`, read from the reply as it is relayed.

Real MCP servers report failures inside HTTP 200: a JSON-RPC `error` for a bad request, a
result with `isError: true` for a tool that failed. The proxy forwards every byte unchanged and
reads alongside, only for requests that carry a `tools/call` (or ask about a task): the reply
as it is relayed (one JSON body, or the SSE events until the awaited responses have passed).

Since 2026-07-28 a result may be no call's end (`resultType`): `input_required` asks the
client something first, and it retries the call; `task` (the tasks extension) is a handle the
client polls with `tasks/get`, whose reply carries the end. Such replies are marked `interim`
(and a handle's task id kept), and a reply about a task that ends it says how the call went.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any, Final

import orjson

from gateway.mcp.sse import SseError, SseParser
from gateway.mcp.tool_list_budget import MAX_TOOL_LIST_BYTES
from gateway.proxy.requests import ToolCallSeen
from gateway.upstreams.fingerprints import ToolWatch

# error_message is a reason to read, not a copy of the reply.
MAX_ERROR_CHARS: Final = 1000
# A reply (or one SSE event) larger than this is relayed without being read: its calls are
# judged by the HTTP status alone. Errors are small; only results grow this large.
MAX_JUDGED_BYTES: Final = 4 << 20

CALLER_CANCELLED: Final = "cancelled by the caller"
# The error a 2025-era SDK server answers a request with once the client cancelled it
# (LSP's RequestCancelled; 2026-07-28 servers send nothing and the client hangs up instead).
_REQUEST_CANCELLED: Final = -32800


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


# A response: (its id, why the call failed or None, its result object or None).
_Response = tuple[Any, str | None, dict[str, Any] | None]


def _response(message: Any) -> _Response | None:
    """A JSON-RPC response as (id, why the call failed or None, the result object, None for
    an error); None for any other message (a notification, a request from the server,
    something else)."""
    if type(message) is not dict:
        return None
    error = message.get("error")
    if type(error) is dict:
        return message.get("id"), rpc_error_text(error), None
    if "result" not in message:
        return None
    result = message["result"]
    if type(result) is not dict:
        return message.get("id"), None, None
    if result.get("isError") is True:
        return message.get("id"), failed_result_text(result), result
    return message.get("id"), None, result


def _answers(response_id: Any, reason: str | None, rid: Any) -> bool:
    # 1 and "1" (and True) are different ids. A refusal without an id (parse error, invalid
    # request) answers every call of the request.
    return (response_id == rid and type(response_id) is type(rid)) or (
        response_id is None and reason is not None
    )


def read_reply(calls: list[ToolCallSeen], body: bytes) -> Sequence[ToolCallSeen]:
    """A whole JSON reply (one response, or a batch of them): marks the calls it answers.
    Returns the calls it turned into tasks (to follow before the reply is passed on)."""
    if len(calls) == 1:  # the usual case, without the bookkeeping
        call = calls[0]
        if not call.tasked and _plain_result(body):
            call.answered = True
            return ()
        message = _loads(body) if body else None
        response = _response(message)
        if response is not None and _answers(response[0], response[1], call.rid):
            return (call,) if _judged(call, response[1], response[2]) else ()
        return ()
    message = _loads(body) if body else None
    waiting = _Waiting(calls)
    waiting.read(message)
    return waiting.handles


def _plain_result(body: bytes) -> bool:
    """Whether a reply to one call is a result that ends it and cannot be a failure, seen
    without parsing it (most replies): a JSON-RPC error needs an `"error"` key and a failed
    result `true`, a literal no escape can spell; a backslash might hide the key, so such
    bodies are parsed. A `resultType` (2026-07-28) other than `"complete"`, or spelled
    otherwise, or twice, is parsed too: an interim answer or a task handle is no call's end.
    That costs one more scan of the body, the last occurrence found from its end, where
    servers write it (after the content). (A result for another id would pass for ours: only
    a broken server sends one.)

    find(), not `in`: bytes' `in` first tries its argument as an int, raising and clearing a
    TypeError each time, which costs twice the search (measured with callgrind)."""
    find = body.find
    if not (
        body[:1] == b"{"
        and find(b'"result"') >= 0
        and find(b'"error"') < 0
        and find(b"true") < 0
        and find(b"\\") < 0
    ):
        return False
    at = body.rfind(b'"resultType"')
    return at < 0 or (
        body.startswith(b'"resultType":"complete"', at) and find(b'"resultType"', 0, at) < 0
    )


# What a result's `resultType` says when the call is not over (2026-07-28).
_INPUT_REQUIRED: Final = "input_required"
_TASK: Final = "task"
# Task statuses that end it (the tasks extension; 2025-11-25's tasks).
_COMPLETED: Final = "completed"
_FAILED: Final = "failed"
_CANCELLED: Final = "cancelled"
# Why a call whose task was cancelled with tasks/cancel is an error.
TASK_CANCELLED: Final = f"{CALLER_CANCELLED}: it cancelled the task (tasks/cancel)"


def _judged(call: ToolCallSeen, reason: str | None, result: dict[str, Any] | None) -> bool:
    """Marks the call its response answers; True when that response turned it into a task.

    The usual final result costs one dictionary lookup here (`resultType`): a result read
    whole is at hand already."""
    call.answered, call.error = True, reason
    if call.about is not None:
        _read_about_task(call, reason, result)
        return False
    if result is None:
        return False
    kind = result.get("resultType")
    if kind is None or kind == "complete":
        if not call.tasked:
            return False
        # 2025-11-25: a call that asked for a task gets `{"task": {...}}` (no content).
        task = result.get("task")
        if type(task) is not dict or "content" in result:
            return False
        return _handle(call, task.get("taskId"), task.get("ttl"))
    if kind == _INPUT_REQUIRED:
        # The server asks the client first; the client retries the same call, whose reply
        # is logged then: this one is no row.
        call.interim, call.error = True, None
        return False
    if kind == _TASK:
        return _handle(call, result.get("taskId"), result.get("ttlMs"))
    return False  # a kind of an extension the gateway does not know: taken as final


def _handle(call: ToolCallSeen, task_id: Any, ttl_ms: Any) -> bool:
    if type(task_id) is not str:
        return False  # a handle without a task id cannot be followed: taken as final
    call.interim, call.error = True, None
    call.task_id = task_id
    call.ttl_ms = ttl_ms if type(ttl_ms) is int else None
    return True


def _read_about_task(call: ToolCallSeen, reason: str | None, result: dict[str, Any] | None) -> None:
    """Whether the reply to a request about a task ends the task (the call it stands for),
    and how: `interim` stays set when it does not, `error` says why the call failed.

    - `tasks/get`: a final status, with the tool's result inlined when completed (the tasks
      extension; a 2025-11-25 server says `completed` without it, and the client then asks
      `tasks/result`), the JSON-RPC error when failed;
    - `tasks/result` (2025-11-25): its result or error is the call's own;
    - `tasks/cancel`: acknowledged, the caller cancelled the call.
    An error answering `tasks/get` or `tasks/cancel` (an unknown or expired task) ends
    nothing."""
    method = call.about
    if method == "tasks/result":
        call.interim = result is not None and result.get("resultType") == _INPUT_REQUIRED
        return
    if result is None:
        call.error = None
        return
    if method == "tasks/cancel":
        call.interim, call.error = False, TASK_CANCELLED
        return
    task_id = result.get("taskId")
    if task_id is not None and task_id != call.task_id:
        call.error = None  # about another task than asked: ends nothing of this one
        return
    status = result.get("status")
    message = result.get("statusMessage")
    said = f": {message}" if type(message) is str and message else ""
    if status == _COMPLETED:
        inlined = result.get("result")
        if type(inlined) is not dict:
            return  # 2025-11-25: the result comes with tasks/result
        call.interim = False
        call.error = failed_result_text(inlined) if inlined.get("isError") is True else None
    elif status == _FAILED:
        error = result.get("error")
        call.interim = False
        call.error = (
            rpc_error_text(error) if type(error) is dict else shorten(f"the task failed{said}")
        )
    elif status == _CANCELLED:
        call.interim, call.error = False, shorten(f"the task was cancelled{said}")


def _key(rid: Any) -> tuple[type, Any] | None:
    """A dict key for an id; None for an id no response can be matched to (not a JSON scalar)."""
    return (type(rid), rid) if isinstance(rid, str | int | float) else None


class _Waiting:
    """The calls of a request not answered yet, by id (a batch may hold thousands)."""

    __slots__ = ("by_id", "handles", "read_now")

    def __init__(self, calls: list[ToolCallSeen]) -> None:
        self.by_id: dict[tuple[type, Any], list[ToolCallSeen]] = {}
        for call in calls:
            key = _key(call.rid)
            if key is not None:
                self.by_id.setdefault(key, []).append(call)
        # Answered by what was read since the last look.
        self.read_now: list[ToolCallSeen] = []
        # Turned into tasks by what was read, not followed yet.
        self.handles: list[ToolCallSeen] = []

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
        response_id, reason, result = response
        if response_id is None and reason is not None:
            calls = [call for waiting in self.by_id.values() for call in waiting]
            self.by_id.clear()
        else:
            key = _key(response_id)
            calls = [] if key is None else self.by_id.pop(key, [])
        for call in calls:
            if _judged(call, reason, result):
                self.handles.append(call)
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

    def feed(self, chunk: bytes) -> bool:
        """The next chunk of the reply, before it is written to the caller. True when it
        turned calls into tasks: take_handles() says which, to follow before the write."""
        if self.done:
            return False
        if self._sse is None:
            if self._body is None:
                self._body = bytearray()
            self._body += chunk
            if len(self._body) > MAX_JUDGED_BYTES:
                self._give_up()
            return False
        try:
            events = self._sse.feed(chunk)
        except SseError:
            self._give_up()
            return False
        if self._sse.last_event_id is not None:
            self.resumable = True
        for event in events:
            # Priming events are empty; progress and log notifications are read and skipped.
            if event.data:
                self._waiting.read(_loads(event.data))
                if not self._waiting.by_id:
                    break
        return bool(self._waiting.handles)

    def finish(self) -> bool:
        """The reply ended (everything fed was written). True when it turned calls into tasks
        (a streamed JSON reply is read only now, after it was passed on)."""
        if self._body is not None and not self.done:
            body, self._body = bytes(self._body), None
            self._waiting.read(_loads(body))
        return bool(self._waiting.handles)

    def take_handles(self) -> list[ToolCallSeen]:
        """The calls turned into tasks since the last look."""
        handles, self._waiting.handles = self._waiting.handles, []
        return handles

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


class ListTap(ReplyReader):
    """A `tools/list` reply nothing is cut from, read as it is relayed: a copy is kept (up to
    the tool list bound) and handed to the watch for its fingerprints (tool integrity) once
    the reply has ended and reached the caller. It finds no calls: the request held none."""

    __slots__ = ("_copy", "_done", "_watch")

    def __init__(
        self,
        watch: ToolWatch,
        server_id: uuid.UUID,
        workspace_id: uuid.UUID,
        event_stream: bool,
        ids: list[Any],
        sent: bytes,
    ) -> None:
        super().__init__([], event_stream=False)
        self._watch = watch
        self._copy: bytearray | None = bytearray()
        # What the watch needs besides the body, for ToolWatch.relayed.
        self._done = (server_id, workspace_id, event_stream, ids, sent)

    def feed(self, chunk: bytes) -> bool:
        if self._copy is not None:
            self._copy += chunk
            if len(self._copy) > MAX_TOOL_LIST_BYTES:
                self._copy = None  # over the bound any list is refused at: not fingerprinted
        return False

    def finish(self) -> bool:
        if self._copy is not None:
            server_id, workspace_id, event_stream, ids, sent = self._done
            self._watch.relayed(server_id, workspace_id, bytes(self._copy), event_stream, ids, sent)
            self._copy = None
        return False
