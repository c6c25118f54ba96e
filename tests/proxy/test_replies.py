"""Each proxied call's outcome, read from the reply as it is relayed: JSON, batches, SSE."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.proxy.replies import MAX_ERROR_CHARS, MAX_JUDGED_BYTES, ReplyReader, read_reply
from gateway.proxy.requests import (
    ToolCallSeen,
    tool_calls_in,
)


def names(body: bytes) -> list[tuple[str, Any]]:
    return [(call.name, call.rid) for call in tool_calls_in(body)]


# -- outcomes ----------------------------------------------------------------------------------


def calls(*ids: Any) -> list[ToolCallSeen]:
    return [ToolCallSeen(f"tool-{rid}", rid) for rid in ids]


def response(rid: Any, *, error: dict[str, Any] | None = None, failed: bool = False) -> Any:
    if error is not None:
        return {"jsonrpc": "2.0", "id": rid, "error": error}
    content = [{"type": "text", "text": "it broke" if failed else "fine"}]
    return {"jsonrpc": "2.0", "id": rid, "result": {"content": content, "isError": failed}}


def outcome(call: ToolCallSeen) -> tuple[bool, str | None]:
    return call.answered, call.error


def test_a_json_reply_decides_the_call() -> None:
    seen = calls(1)
    read_reply(seen, orjson.dumps(response(1, failed=True)))
    assert outcome(seen[0]) == (True, "it broke")
    others = (response(2, failed=True), response("1", failed=True), response(True, failed=True))
    for reply in (*others, {"jsonrpc": "2.0", "id": 1}):
        seen = calls(1)
        read_reply(seen, orjson.dumps(reply))
        assert outcome(seen[0]) == (False, None), reply
    seen = calls(1)
    read_reply(seen, b"<html>a login page</html>")
    assert outcome(seen[0]) == (False, None)


@pytest.mark.parametrize(
    "reply",
    [
        response(1),
        response(1, failed=True),
        response(1, error={"code": 1, "message": "no"}),
        rpc := {"jsonrpc": "2.0", "id": 1, "result": {"content": [], "isError": False}},
        {**rpc, "result": {"content": [{"type": "text", "text": 'say "error" or true'}]}},
        {**rpc, "result": {"isError": True}},
        {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "a\nb"}]}},
    ],
)
@pytest.mark.parametrize("indent", [False, True])
def test_reading_without_parsing_agrees_with_parsing(reply: Any, indent: bool) -> None:
    """The shortcut for plain results decides exactly as reading the parsed reply does."""
    body = orjson.dumps(reply, option=orjson.OPT_INDENT_2 if indent else 0)
    seen = calls(1)
    read_reply(seen, body)
    failed = "error" in reply or reply["result"].get("isError") is True
    assert seen[0].answered
    assert (seen[0].error is not None) == failed


def test_a_batch_reply_gives_each_call_its_own_response() -> None:
    seen = calls(1, "1", 2, 3, {"not": "an id"})
    reply = [
        response(3),
        response("1", error={"code": -32602, "message": "Invalid params: a is required"}),
        response(1, failed=True),
        response({"not": "an id"}),
    ]
    read_reply(seen, orjson.dumps(reply))
    assert [outcome(call) for call in seen] == [
        (True, "it broke"),
        (True, "JSON-RPC error -32602: Invalid params: a is required"),
        (False, None),  # no response for 2
        (True, None),
        (False, None),  # an id no response can be matched to
    ]


@pytest.mark.parametrize("ids", [(1,), (1, 2)])
def test_an_error_without_id_fails_every_call_of_the_request(ids: tuple[int, ...]) -> None:
    seen = calls(*ids)
    read_reply(seen, orjson.dumps(response(None, error={"code": -32700, "message": "Parse"})))
    assert [outcome(call) for call in seen] == [(True, "JSON-RPC error -32700: Parse")] * len(ids)


def test_a_cancelled_request_is_named_as_the_callers_doing() -> None:
    seen = calls(1)
    read_reply(
        seen, orjson.dumps(response(1, error={"code": -32800, "message": "Request cancelled"}))
    )
    assert seen[0].error == (
        "cancelled by the caller (the server confirmed: JSON-RPC error -32800: Request cancelled)"
    )


def test_reasons_are_shortened() -> None:
    seen = calls(1)
    long = {"content": [{"type": "text", "text": "x" * 5000}], "isError": True}
    read_reply(seen, orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": long}))
    assert seen[0].error is not None and len(seen[0].error) == MAX_ERROR_CHARS


def relayed(call: ToolCallSeen) -> tuple[bool, str | None]:
    return call.relayed, call.error


def sse(*events: str) -> bytes:
    return "".join(events).encode()


def test_sse_the_response_is_the_event_with_the_id_after_notifications() -> None:
    seen = calls(7)
    reader = ReplyReader(seen, event_stream=True)
    progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
    other = response(8, failed=True)  # some other request's answer
    stream = sse(
        "id: 1\nretry: 100\ndata:\n\n",  # a priming event
        ": comment\n\n",
        f"event: message\ndata: {orjson.dumps(progress).decode()}\n\n",
        "data: not json at all\n\n",
        f"data: {orjson.dumps(other).decode()}\n\n",
        "data: "
        + orjson.dumps(response(7, failed=True), option=orjson.OPT_INDENT_2)
        .decode()
        .replace("\n", "\ndata: ")
        + "\n\n",
    )
    cut = stream.index(b'"id": 7') + 3
    reader.feed(stream[:cut])
    reader.delivered()
    assert outcome(seen[0]) == (False, None)  # not complete yet
    reader.feed(stream[cut:])
    assert relayed(seen[0]) == (False, "it broke")  # read, but not written to the caller yet
    reader.delivered()
    assert relayed(seen[0]) == (True, "it broke")
    assert reader.done and reader.resumable


def test_a_streamed_json_reply_is_read_at_its_end() -> None:
    seen = calls(1)
    reader = ReplyReader(seen, event_stream=False)
    body = orjson.dumps(response(1, error={"code": 1, "message": "no"}))
    for i in range(0, len(body), 5):
        reader.feed(body[i : i + 5])
        reader.delivered()
    assert not seen[0].answered
    reader.finish()
    reader.delivered()
    assert relayed(seen[0]) == (True, "JSON-RPC error 1: no")


def test_a_reply_too_large_to_read_is_left_to_the_http_status() -> None:
    seen = calls(1)
    reader = ReplyReader(seen, event_stream=False)
    chunk = b" " * (1 << 20)
    for _ in range(MAX_JUDGED_BYTES // len(chunk) + 1):
        reader.feed(chunk)
    reader.finish()
    reader.delivered()
    assert reader.blind and relayed(seen[0]) == (False, None)
