"""The calls in a proxied request body, and the bodies refused because a server could read them
differently from the gateway."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.proxy.requests import (
    INVALID_REQUEST,
    MAX_BATCH,
    PARSE_ERROR,
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


# -- requests about a task ---------------------------------------------------------------------


def asked_about(body: bytes) -> list[tuple[str | None, str | None, Any]]:
    return [(seen.about, seen.task_id, seen.rid) for seen in tool_calls_in(body)]


def test_requests_about_a_task_are_seen_with_their_task() -> None:
    get = b'{"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{"taskId":"t-1"}}'
    assert asked_about(get) == [("tasks/get", "t-1", 3)]
    escaped = get.replace(b"tasks/get", b"tasks\\/get")
    assert asked_about(escaped) == [("tasks/get", "t-1", 3)]
    batch = (
        b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add"}},'
        b'{"jsonrpc":"2.0","id":2,"method":"tasks/result","params":{"taskId":"t-2"}}]'
    )
    assert asked_about(batch) == [(None, None, 1), ("tasks/result", "t-2", 2)]
    # Nothing to follow: a notification, no task id, another method, not JSON. Nothing
    # about a task decides what runs, so nothing is refused either.
    for body in (
        b'{"jsonrpc":"2.0","method":"tasks/get","params":{"taskId":"t-1"}}',
        b'{"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{"taskId":7}}',
        b'{"jsonrpc":"2.0","id":3,"method":"tasks/update","params":{"taskId":"t-1"}}',
        b'{"jsonrpc":"2.0","id":3,"method":"tasks/get", oops',
    ):
        assert tool_calls_in(body) == [], body
