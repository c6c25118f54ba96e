"""Each proxied call's outcome, read from the reply as it is relayed: JSON, batches, SSE."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.proxy.replies import (
    MAX_ERROR_CHARS,
    MAX_JUDGED_BYTES,
    TASK_CANCELLED,
    ReplyReader,
    read_reply,
)
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


# -- replies that are no call's end (2026-07-28) ------------------------------------------------


def result(rid: Any, body: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": body})


ASKING = {
    "inputRequests": {"name": {"method": "elicitation/create", "params": {"message": "Name?"}}},
    "resultType": "input_required",
}
HANDLE = {"resultType": "task", "taskId": "t-1", "status": "working", "ttlMs": 60000}
DONE = {"content": [{"type": "text", "text": "fine"}], "isError": False}


@pytest.mark.parametrize("indent", [False, True])
def test_an_input_required_answer_is_interim(indent: bool) -> None:
    body = orjson.dumps(
        {"jsonrpc": "2.0", "id": 1, "result": ASKING},
        option=orjson.OPT_INDENT_2 if indent else 0,
    )
    seen = calls(1)
    assert read_reply(seen, body) == ()
    assert seen[0].answered and seen[0].interim and seen[0].error is None
    seen = calls(1)
    reader = ReplyReader(seen, event_stream=True)
    assert not reader.feed(b"event: message\ndata: " + result(1, ASKING) + b"\n\n")
    reader.delivered()
    assert seen[0].relayed and seen[0].interim


@pytest.mark.parametrize(
    "body",
    [
        # What an SDK server writes: read without parsing, and final.
        {**DONE, "resultType": "complete"},
        # The same result spelled otherwise is parsed, and final too.
        {"resultType": "complete", **DONE},
        {**DONE, "resultType": "some-extension's"},
        # A result that only quotes a resultType in its content stays final.
        {**DONE, "structuredContent": {"resultType": "complete"}},
    ],
)
def test_a_final_result_is_not_interim(body: dict[str, Any]) -> None:
    seen = calls(1)
    assert read_reply(seen, result(1, body)) == ()
    assert seen[0].answered and not seen[0].interim and seen[0].error is None


def test_a_task_handle_is_interim_and_names_its_task() -> None:
    seen = calls(1)
    assert read_reply(seen, result(1, HANDLE)) == tuple(seen)
    assert seen[0].interim and (seen[0].task_id, seen[0].ttl_ms) == ("t-1", 60000)
    # A resultType quoted in the content does not hide the handle's.
    seen = calls(1)
    quoting = {**HANDLE, "_meta": {"note": {"resultType": "complete"}}}
    assert read_reply(seen, result(1, quoting)) == tuple(seen)
    # Over SSE the reader says so before the chunk is written, and hands the handles once.
    seen = calls(1)
    reader = ReplyReader(seen, event_stream=True)
    assert reader.feed(b"data: " + result(1, HANDLE) + b"\n\n")
    assert reader.take_handles() == seen and reader.take_handles() == []
    # Without a task id there is nothing to follow: taken as final.
    seen = calls(1)
    assert read_reply(seen, result(1, {**HANDLE, "taskId": 7})) == ()
    assert not seen[0].interim


def test_a_2025_task_handle_counts_only_for_a_call_that_asked_for_one() -> None:
    handle = {"task": {"taskId": "t-1", "status": "working", "ttl": 1000}}
    asked = tool_calls_in(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call",'
        b'"params":{"name":"deep","arguments":{},"task":{"ttl":1000}}}'
    )
    assert asked[0].tasked
    assert read_reply(asked, result(1, handle)) == tuple(asked)
    assert asked[0].task_id == "t-1" and asked[0].ttl_ms == 1000
    not_asked = calls(1)
    assert read_reply(not_asked, result(1, handle)) == ()
    assert not not_asked[0].interim


def about(method: str, task_id: str = "t-1", rid: int = 2) -> list[ToolCallSeen]:
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": {"taskId": task_id}}
    seen = tool_calls_in(orjson.dumps(body))
    assert [(s.about, s.task_id, s.interim) for s in seen] == [(method, task_id, True)]
    return seen


def ends(seen: list[ToolCallSeen], reply: dict[str, Any]) -> tuple[bool, str | None]:
    read_reply(seen, orjson.dumps({"jsonrpc": "2.0", "id": 2, **reply}))
    return not seen[0].interim, seen[0].error


def test_what_ends_a_task_and_how() -> None:
    task = {"resultType": "complete", "taskId": "t-1", "createdAt": "now"}
    failed = {**DONE, "isError": True, "content": [{"type": "text", "text": "no luck"}]}
    error = {"code": -32603, "message": "backend gone"}
    get = "tasks/get"
    assert ends(about(get), {"result": {**task, "status": "working"}}) == (False, None)
    assert ends(about(get), {"result": {**task, "status": "input_required"}}) == (False, None)
    assert ends(about(get), {"result": {**task, "status": "completed", "result": DONE}}) == (
        True,
        None,
    )
    assert ends(about(get), {"result": {**task, "status": "completed", "result": failed}}) == (
        True,
        "no luck",
    )
    # 2025-11-25: completed, and the result comes with tasks/result.
    assert ends(about(get), {"result": {**task, "status": "completed"}}) == (False, None)
    assert ends(about(get), {"result": {**task, "status": "failed", "error": error}}) == (
        True,
        "JSON-RPC error -32603: backend gone",
    )
    assert ends(about(get), {"result": {**task, "status": "failed", "statusMessage": "x"}}) == (
        True,
        "the task failed: x",
    )
    assert ends(about(get), {"result": {**task, "status": "cancelled"}}) == (
        True,
        "the task was cancelled",
    )
    # About another task than asked, or an unknown task: nothing ends.
    other = {**task, "taskId": "t-2", "status": "completed", "result": DONE}
    assert ends(about(get), {"result": other}) == (False, None)
    assert ends(about(get), {"error": {"code": -32602, "message": "Task not found"}}) == (
        False,
        None,
    )
    assert ends(about("tasks/result"), {"result": failed}) == (True, "no luck")
    assert ends(about("tasks/result"), {"error": error}) == (
        True,
        "JSON-RPC error -32603: backend gone",
    )
    assert ends(about("tasks/cancel"), {"result": {"resultType": "complete"}}) == (
        True,
        TASK_CANCELLED,
    )
    assert ends(about("tasks/cancel"), {"error": error}) == (False, None)
