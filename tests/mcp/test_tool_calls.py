"""Reading tools/call exchanges: every call in a request body, each call's outcome in the reply."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.proxy.replies import MAX_ERROR_CHARS, MAX_JUDGED_BYTES, ReplyReader, read_reply
from gateway.proxy.requests import (
    INVALID_REQUEST,
    MAX_BATCH,
    PARSE_ERROR,
    ToolCallSeen,
    UnreadableRequest,
    tool_calls_in,
)


def names(body: bytes) -> list[tuple[str, Any]]:
    return [(call.name, call.rid) for call in tool_calls_in(body)]


# -- every tools/call is seen ------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add"}}',
        # Escapes the byte search cannot see through.
        b'{"jsonrpc":"2.0","id":1,"method":"tools\\/call","params":{"name":"add"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"\\u0074ools/call","params":{"name":"add"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"\\u0074\\u006f\\u006f\\u006c\\u0073\\u002f'
        b'\\u0063\\u0061\\u006c\\u006c","params":{"name":"\\u0061dd"}}',
        b'{"jsonrpc":"2.0","id":1,"\\u006dethod":"tools\\u002fcall","params":{"name":"add"}}',
        # Whitespace of every kind, pretty-printed.
        b'{\n  "jsonrpc" : "2.0",\r\n\t"id" :1 ,\n  "method"\n:\n"tools/call",'
        b'\n  "params": {\n    "name": "add"\n  }\n}\n',
        # Minimal: no params at all is still a call, of an unnamed tool.
        b'{"method":"tools/call","id":1,"params":{"name":"add"}}',
        # What orjson refuses but a Python SDK server accepts.
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add",'
        b'"arguments":{"a":NaN}}}',
    ],
)
def test_every_spelling_of_a_tools_call_is_seen(body: bytes) -> None:
    assert names(body) == [("add", 1)]


def test_a_batch_gives_each_call_with_its_id() -> None:
    batch = orjson.dumps(
        [
            {"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": {"name": "one"}},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "notified"}},
            {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "two"}},
        ]
    )
    assert names(batch) == [("one", "a"), ("notified", None), ("two", 3)]


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
        b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"text":"tools/call"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"text":"tools\\/call"}}',
        b'{"jsonrpc":"2.0","id":1,"result":{"method":"tools/call"}}',
        b'"tools/call"',
    ],
)
def test_anything_else_is_not_a_call(body: bytes) -> None:
    assert names(body) == []


# -- what the gateway cannot read as the server would is refused, never forwarded unlogged ------


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        # A lenient server decodes invalid UTF-8 (or drops it) and may find a call in it.
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/ca\xffll","params":{"name":"x"}}', "UTF-8"),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"t":"\xc3"}}', "UTF-8"),
        # Deeper than 64 levels, in a call's arguments or anywhere else.
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":'
            + b'{"a":' * 63
            + b"1"
            + b"}" * 63
            + b"}}",
            "deeper than 64",
        ),
        (b"[" * 65 + b"]" * 65, "deeper than 64"),
        (b"[" * 5000 + b"]" * 5000 + b"\\", "deeper than 64"),  # deeper than parsers go
        # A body that may hold a call but is not JSON.
        (b"not json but tools/call", "not JSON"),
        (b'{"method":"tools\\/call", oops}', "not JSON"),
        # A deciding key named twice: a server taking the first would run what the gateway
        # (taking the last) never saw, or under another name.
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"ping","params":{}}',
            "'method' is named twice",
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call",'
            b'"params":{"name":"add"}}',
            "'method' is named twice",
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call",'
            b'"params":{"name":"allowed","name":"other"}}',
            "'name' is named twice",
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"\\u006dethod":"tools/call","method":"ping"}',
            "'method' is named twice",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_what_cannot_be_read_as_the_server_reads_it_is_a_parse_error(
    body: bytes, problem: str
) -> None:
    with pytest.raises(UnreadableRequest) as refused:
        tool_calls_in(body)
    assert refused.value.code == PARSE_ERROR
    assert problem in refused.value.message


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
def test_a_call_in_another_encoding_is_refused(encoding: str) -> None:
    """Without a BOM such a body holds no `tools/call` the bytes show, and a server that
    detects the encoding (Python's json.loads does) runs it."""
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rm"}}'
    with pytest.raises(UnreadableRequest) as refused:
        tool_calls_in(body.decode().encode(encoding))
    assert refused.value.message == "Parse error: the body is not valid UTF-8"
    with pytest.raises(UnreadableRequest):
        tool_calls_in(body.decode().encode(encoding.replace("-le", "").replace("-be", "")))


@pytest.mark.parametrize(
    ("body", "key"),
    [
        # Go's encoding/json (mcp-go) matches keys case-insensitively, also through Unicode
        # case folding (the long s, U+017F, is an s; the Kelvin sign, U+212A, a k).
        (b'{"jsonrpc":"2.0","id":5,"Method":"tools/call","params":{"name":"rm"}}', "Method"),
        (b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"ls","NAME":"rm"}}',
         "NAME"),
        (b'{"jsonrpc":"2.0","id":5,"method":"tools/call","param\\u017f":{"name":"rm"}}',
         "param\u017f"),
        ('{"jsonrpc":"2.0","id":5,"method":"tools/call","param\u017f":{"name":"rm"}}'.encode(),
         "param\u017f"),
    ],
)  # fmt: skip
def test_a_deciding_key_in_another_letter_case_is_refused(body: bytes, key: str) -> None:
    with pytest.raises(UnreadableRequest) as refused:
        tool_calls_in(body)
    assert refused.value.message.startswith(f"Parse error: the key {key!r} is")
    assert "in another letter case" in refused.value.message


@pytest.mark.parametrize(
    "body",
    [
        # A second message without the key (or not an object) hides nothing.
        b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"ping","params":{"name":"rm"}},'
        b'{"jsonrpc":"2.0","id":2,"result":{}}]',
        b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rm","name":"ls"}},'
        b'{"jsonrpc":"2.0","id":2,"result":{}}]',
        b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rm","name":"ls"}},1]',
    ],
)
def test_a_key_named_twice_is_refused_in_a_batch_too(body: bytes) -> None:
    with pytest.raises(UnreadableRequest) as refused:
        tool_calls_in(body)
    assert "is named twice in one object" in refused.value.message


def test_keys_named_twice_deep_in_the_arguments_change_nothing() -> None:
    body = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x",'
        b'"arguments":{"rows":[{"name":1,"name":2}],"Method":"GET"}}}'
    )
    assert names(body) == [("x", 1)]


def test_brackets_in_texts_are_not_nesting() -> None:
    text = "[" * 200 + "{" * 200
    body = orjson.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": "x", "arguments": {"text": text, "q": '\\"[[['}}}
    )  # fmt: skip
    assert names(body) == [("x", 1)]


def test_more_than_100000_arrays_and_objects_are_refused_before_parsing() -> None:
    many = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":'
    assert names(many + b'{"a":[' + b"[]," * 99_990 + b"[]]}}}") == [("x", 1)]
    with pytest.raises(UnreadableRequest) as refused:
        tool_calls_in(many + b'{"a":[' + b"[]," * 100_000 + b"[]]}}}")
    assert "more than 100,000 arrays and objects" in refused.value.message
    with pytest.raises(UnreadableRequest):
        tool_calls_in(b"[" + b"[]," * 100_000 + b"[]]")  # no call: refused all the same


def test_a_batch_holds_at_most_100_messages() -> None:
    ping = {"jsonrpc": "2.0", "method": "notifications/progress"}
    assert tool_calls_in(orjson.dumps([ping] * MAX_BATCH)) == []
    with pytest.raises(UnreadableRequest) as refused:
        tool_calls_in(b" \n" + orjson.dumps([ping] * (MAX_BATCH + 1)))
    assert refused.value.code == INVALID_REQUEST
    assert "at most 100 messages" in refused.value.message


@pytest.mark.parametrize(
    "body",
    [
        # 64 levels, arguments with many objects, keys named like the deciding ones where
        # that changes nothing, escapes in texts, text that is not ASCII.
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":'
        + b'{"a":' * 62
        + b"1"
        + b"}" * 62
        + b"}}",
        orjson.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "x", "arguments": {"rows": [{"name": i} for i in range(200)]}},
            }
        ),
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":'
        '{"text":"line\\none \\"quoted\\" \\u00e9t\u00e9 \u65e5\u672c"}}}'.encode(),
    ],
)
def test_ordinary_calls_are_read(body: bytes) -> None:
    assert names(body) == [("x", 1)]


def test_names_are_made_storable_and_bounded() -> None:
    body = b'{"id":1,"method":"tools/call","params":{"name":"a\\u0000b\\ud800' + b"x" * 300 + b'"}}'
    [(name, _)] = names(body)
    assert name.startswith("ab\ufffd")
    assert "\x00" not in name and len(name) <= 255
    name.encode()  # valid UTF-8
    assert names(b'{"id":1,"method":"tools/call","params":{"name":""}}') == [("(unnamed)", 1)]
    assert names(b'{"id":1,"method":"tools/call","params":[]}') == [("(unnamed)", 1)]


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
