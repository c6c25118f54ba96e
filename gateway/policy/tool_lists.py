"""`tools/list` replies cut down to the tools a caller may call, for callers a tool rule
applies to (every other reply passes byte for byte, unparsed).

The request says which JSON-RPC ids are `tools/list` calls; the reply (one JSON message, a
batch, or an SSE stream of them) has the `result.tools` of those ids filtered, and is marked
`cacheScope: "private"` (2026-07-28): a list cut for one caller must not be shared.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

import orjson

TOOLS_LIST: Final = "tools/list"
# An SSE event ends at a blank line (any of the three line ends; CR LF is one, not two).
_LINE_END = rb"(?:\r\n|\r(?!\n)|\n)"
_EVENT_END = re.compile(_LINE_END + _LINE_END)


def tools_list_ids(body: bytes) -> list[Any] | None:
    """The ids of the `tools/list` requests in a request body; None when there are none.
    Parsed only when it may hold one (its method spelled out, or escaped)."""
    if b"tools/list" not in body and b"\\" not in body:
        return None
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # the proxy refuses bodies it cannot read before this
    messages = message if type(message) is list else [message]
    ids = [
        m.get("id")
        for m in messages
        if type(m) is dict and m.get("method") == TOOLS_LIST and m.get("id") is not None
    ]
    return ids or None


def filter_reply(
    body: bytes, event_stream: bool, ids: list[Any], visible: Callable[[str], bool]
) -> bytes:
    """The reply with the tools the caller may not call left out of each listed response."""
    if not event_stream:
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body  # not a JSON-RPC answer (an HTTP error page): nothing to filter
        return orjson.dumps(message) if _filter_messages(message, ids, visible) else body
    return b"".join(_filter_events(body, ids, visible))


def _filter_events(body: bytes, ids: list[Any], visible: Callable[[str], bool]) -> list[bytes]:
    parts: list[bytes] = []
    start = 0
    for end in _EVENT_END.finditer(body):
        parts.append(_filter_event(body[start : end.start()], ids, visible))
        parts.append(end.group(0))
        start = end.end()
    parts.append(body[start:])  # an unterminated last event (a stream cut short) as it came
    return parts


def _filter_event(event: bytes, ids: list[Any], visible: Callable[[str], bool]) -> bytes:
    lines = event.splitlines()
    data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    if not data:
        return event
    try:
        message = orjson.loads(b"\n".join(data))
    except orjson.JSONDecodeError:
        return event
    if not _filter_messages(message, ids, visible):
        return event
    kept = [line for line in lines if not line.startswith(b"data:")]
    line_end = b"\r\n" if b"\r\n" in event else b"\n"
    return line_end.join([*kept, b"data: " + orjson.dumps(message)])


def _filter_messages(message: Any, ids: list[Any], visible: Callable[[str], bool]) -> bool:
    """Filter in place; whether anything was a listed response."""
    changed = False
    for one in message if type(message) is list else [message]:
        if type(one) is not dict or one.get("id") not in ids:
            continue
        result = one.get("result")
        if type(result) is not dict or type(result.get("tools")) is not list:
            continue
        result["tools"] = [
            tool
            for tool in result["tools"]
            if type(tool) is dict and type(tool.get("name")) is str and visible(tool["name"])
        ]
        result["cacheScope"] = "private"
        changed = True
    return changed
