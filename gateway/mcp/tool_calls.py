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
MAX_JUDGED_BYTES: Final = 8 << 20

CALLER_CANCELLED: Final = "cancelled by the caller"
# The error a 2025-era SDK server answers a request with once the client cancelled it
# (LSP's RequestCancelled; 2026-07-28 servers send nothing and the client hangs up instead).
_REQUEST_CANCELLED: Final = -32800


class ToolCallSeen:
    """One `tools/call` of a request, and what its reply said about it."""

    __slots__ = ("error", "name", "relayed", "rid")

    def __init__(self, name: str, rid: Any) -> None:
        self.name = name
        # The JSON-RPC id; None for a call sent as a notification (nothing will answer it).
        self.rid = rid
        # Why the call failed, according to its JSON-RPC response (None: it did not, or no
        # response was read).
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


def tool_calls_in(body: bytes) -> list[ToolCallSeen]:
    """Each `tools/call` of a JSON-RPC message or batch, [] for anything else."""
    # Without a backslash every string in the body is spelled as it reads, so a `tools/call`
    # method shows literally; any escape (`tools\/call`, `\u0074ools/call`) might hide one.
    if b"tools/call" not in body and b"\\" not in body:
        return []
    message = _loads(body)
    if isinstance(message, dict):
        return [_seen(message)] if message.get("method") == TOOLS_CALL else []
    if isinstance(message, list):
        return [_seen(m) for m in message if isinstance(m, dict) and m.get("method") == TOOLS_CALL]
    return []


def _seen(message: dict[str, Any]) -> ToolCallSeen:
    params = message.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    if not isinstance(name, str):
        return ToolCallSeen(UNNAMED_TOOL, message.get("id"))
    # Cleaned first: cleaning may lengthen it (a bad byte becomes U+FFFD).
    return ToolCallSeen((clean_text(name) or UNNAMED_TOOL)[:MAX_TOOL_NAME], message.get("id"))


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


def _key(rid: Any) -> tuple[bool, Any]:
    # 1 and "1" are different ids.
    return isinstance(rid, str), rid


class ReplyReader:
    """Finds the responses to a request's `tools/call`s in the reply while it is relayed.

    The proxy hands it every chunk before writing it to the caller (`feed`) and says when the
    write succeeded (`delivered`): a call's outcome is settled once its response reached the
    caller, whatever happens to the connection afterwards.
    """

    __slots__ = (
        "_answered",
        "_body",
        "_sse",
        "_waiting",
        "answered_at",
        "blind",
        "resumable",
    )

    def __init__(self, calls: list[ToolCallSeen], *, event_stream: bool) -> None:
        self._waiting: dict[tuple[bool, Any], list[ToolCallSeen]] = {}
        for call in calls:
            if call.rid is not None:
                self._waiting.setdefault(_key(call.rid), []).append(call)
        # Read, not yet delivered.
        self._answered: list[ToolCallSeen] = []
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
        return not self._waiting or self.blind

    def read_body(self, body: bytes) -> None:
        """A whole JSON reply: one response, or a batch of them."""
        self._read(_loads(body) if body else None)

    def feed(self, chunk: bytes) -> None:
        """The next chunk of a streamed reply, before it is written to the caller."""
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
                self._read(_loads(event.data))
                if not self._waiting:
                    break

    def finish(self) -> None:
        """The streamed reply ended (everything fed was written)."""
        if self._body is not None and not self.done:
            body, self._body = bytes(self._body), None
            self.read_body(body)

    def delivered(self) -> None:
        """Everything fed so far has been handed to the caller."""
        if self._answered:
            for call in self._answered:
                call.relayed = True
            self._answered.clear()
            if not self._waiting:
                self.answered_at = time.perf_counter()

    def _give_up(self) -> None:
        self.blind = True
        self._body = None
        self._sse = None

    def _read(self, message: Any) -> None:
        if isinstance(message, list):  # a batch (only its top level: responses do not nest)
            for item in message:
                self._judge(item)
        else:
            self._judge(message)

    def _judge(self, message: Any) -> None:
        if not isinstance(message, dict):
            return
        error = message.get("error")
        if not isinstance(error, dict):
            error = None
            if "result" not in message:
                return  # not a response: a notification, a request from the server
        rid = message.get("id")
        if rid is None and error is not None:
            # The request as a whole was refused (parse error, invalid request).
            calls = [call for waiting in self._waiting.values() for call in waiting]
            self._waiting.clear()
        else:
            calls = self._waiting.pop(_key(rid), [])
        if not calls:
            return
        reason = None
        if error is not None:
            reason = rpc_error_text(error)
        else:
            result = message.get("result")
            if isinstance(result, dict) and result.get("isError") is True:
                reason = failed_result_text(result)
        for call in calls:
            call.error = reason
        self._answered.extend(calls)
