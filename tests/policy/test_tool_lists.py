"""A `tools/list` reply, cut to what the caller may call: over JSON, a batch and SSE, with
every other message and event left as it came."""

from __future__ import annotations

import orjson

from gateway.policy.tool_lists import filter_reply, tools_list_ids


def listing(rid: object, *names: str, **extra: object) -> dict[str, object]:
    tools = [{"name": n, "inputSchema": {"type": "object"}} for n in names]
    return {"jsonrpc": "2.0", "id": rid, "result": {"tools": tools, **extra}}


def names(message: dict[str, object]) -> list[str]:
    result = message["result"]
    assert isinstance(result, dict)
    return [tool["name"] for tool in result["tools"]]


def visible(name: str) -> bool:
    return name.startswith("read_")


def test_the_ids_of_tools_list_requests_are_read_from_the_body() -> None:
    assert tools_list_ids(b'{"jsonrpc":"2.0","id":7,"method":"tools/list"}') == [7]
    batch = b'[{"jsonrpc":"2.0","id":"a","method":"tools/list"},{"id":2,"method":"ping"}]'
    assert tools_list_ids(batch) == ["a"]
    assert tools_list_ids(b'{"jsonrpc":"2.0","id":1,"method":"tools\\/list"}') == [1]
    assert tools_list_ids(b'{"jsonrpc":"2.0","id":1,"method":"tools/call"}') is None
    # A notification has no response to filter.
    assert tools_list_ids(b'{"jsonrpc":"2.0","method":"tools/list"}') is None


def test_a_json_reply_keeps_only_the_visible_tools_and_is_marked_private() -> None:
    body = orjson.dumps(listing(7, "read_a", "write_b", "read_c", ttlMs=60000, cacheScope="public"))
    message = orjson.loads(filter_reply(body, False, [7], visible))
    assert names(message) == ["read_a", "read_c"]
    assert message["result"]["cacheScope"] == "private"
    assert message["result"]["ttlMs"] == 60000


def test_a_reply_to_another_id_or_an_error_passes_unchanged() -> None:
    other = orjson.dumps(listing(8, "write_b"))
    assert filter_reply(other, False, [7], visible) is other
    error = b'{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"no"}}'
    assert filter_reply(error, False, [7], visible) is error
    page = b"<html>502</html>"
    assert filter_reply(page, False, [7], visible) is page


def test_a_batch_reply_is_filtered_message_by_message() -> None:
    body = orjson.dumps(
        [listing("a", "read_a", "write_b"), {"jsonrpc": "2.0", "id": 2, "result": {}}]
    )
    first, second = orjson.loads(filter_reply(body, False, ["a"], visible))
    assert names(first) == ["read_a"]
    assert second == {"jsonrpc": "2.0", "id": 2, "result": {}}


def test_an_sse_reply_has_its_listing_event_rewritten_and_the_rest_kept() -> None:
    listed = orjson.dumps(listing(3, "read_a", "delete_all"))
    progress = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}'
    body = (
        b"id: 0\r\ndata: \r\n\r\n"  # a priming event
        + b"event: message\r\ndata: "
        + progress
        + b"\r\n\r\n"
        + b"event: message\r\nid: 2\r\ndata: "
        + listed
        + b"\r\n\r\n"
    )
    out = filter_reply(body, True, [3], visible)
    events = out.split(b"\r\n\r\n")
    assert events[0] == b"id: 0\r\ndata: "
    assert events[1] == b"event: message\r\ndata: " + progress
    kept = events[2].split(b"\r\n")
    assert kept[:2] == [b"event: message", b"id: 2"]
    assert names(orjson.loads(kept[2].removeprefix(b"data: "))) == ["read_a"]
    assert b"delete_all" not in out
