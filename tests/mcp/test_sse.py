"""SSE parser: line endings, multi-line data, priming events, retry, chunk splits, size bound."""

from __future__ import annotations

import pytest

from gateway.mcp.sse import SseError, SseEvent, SseParser

STREAM = (
    b"\xef\xbb\xbfid: 1\r\ndata:\r\nretry: 1500\r\n\r\n"  # BOM + SDK-style priming event
    b": a comment\n\n"
    b'event: message\rdata: {"a":\rdata:  1}\r\r'  # CR-only lines, multi-line data
    b"id: 2\r\nevent: endpoint\r\ndata: /messages\r\n\r\n"
    b"data\n\n"  # field without colon: empty data line
    b"data: unfinished"  # no blank line yet: not dispatched
)
EXPECTED = [
    SseEvent(event="message", data="", id="1"),
    SseEvent(event="message", data='{"a":\n 1}', id="1"),
    SseEvent(event="endpoint", data="/messages", id="2"),
    SseEvent(event="message", data="", id="2"),
]


def parse(chunks: list[bytes]) -> tuple[list[SseEvent], SseParser]:
    parser = SseParser(max_event_bytes=8 << 20)
    events = [event for chunk in chunks for event in parser.feed(chunk)]
    return events, parser


def test_whole_stream() -> None:
    events, parser = parse([STREAM])
    assert events == EXPECTED
    assert parser.retry_ms == 1500
    assert parser.last_event_id == "2"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13])
def test_any_chunk_split_gives_the_same_events(size: int) -> None:
    events, _ = parse([STREAM[i : i + size] for i in range(0, len(STREAM), size)])
    assert events == EXPECTED


def test_crlf_split_between_chunks_is_one_line_end() -> None:
    events, _ = parse([b"data: x\r", b"\ndata: y\r", b"\n\r", b"\n"])
    assert events == [SseEvent(event="message", data="x\ny", id=None)]


def test_event_far_over_512_kib() -> None:
    payload = b"y" * (3 * 1024 * 1024)
    stream = b"event: message\r\ndata: " + payload + b"\r\n\r\n"
    events, _ = parse([stream[i : i + 65536] for i in range(0, len(stream), 65536)])
    assert len(events) == 1
    assert events[0].data == payload.decode()


def test_size_bound_on_one_long_line() -> None:
    parser = SseParser(max_event_bytes=1000)
    with pytest.raises(SseError, match="larger than 1000 bytes"):
        parser.feed(b"data: " + b"z" * 2000)


def test_size_bound_across_data_lines() -> None:
    parser = SseParser(max_event_bytes=1000)
    with pytest.raises(SseError):
        for _ in range(20):
            parser.feed(b"data: " + b"z" * 100 + b"\n")
