"""Incremental parser for `text/event-stream` bodies, fed raw chunks of any size or split."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_LINE_END: Final = re.compile(rb"\r\n|\r|\n")
_BOM: Final = b"\xef\xbb\xbf"


class SseError(ValueError):
    """The stream breaks the size bound; the message says by how much."""


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event; `data` has its lines joined with LF, as the SSE standard says."""

    event: str
    data: str
    id: str | None


class SseParser:
    """WHATWG event-stream parsing: CRLF/CR/LF lines, multi-line `data`, comments, `id`, `retry`.

    Works on bytes rather than lines so one event may be far larger than any read buffer
    (aiohttp's `readline` refuses lines over its 512 KiB limit).
    """

    def __init__(self, max_event_bytes: int) -> None:
        self._max_event_bytes = max_event_bytes
        self._buf = bytearray()
        # Where the next line-end search starts: a huge unfinished line is not rescanned per chunk.
        self._scan = 0
        self._started = False
        self._event_type = ""
        self._data: list[str] = []
        self._data_bytes = 0
        self.last_event_id: str | None = None
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Consume a chunk and return the events it completed."""
        buf = self._buf
        buf += chunk
        events: list[SseEvent] = []
        pos = 0
        while True:
            match = _LINE_END.search(buf, max(pos, self._scan))
            if match is None:
                self._scan = len(buf)
                break
            if match.group() == b"\r" and match.end() == len(buf):
                # A CR at the end of what arrived may be the first half of a CRLF.
                self._scan = match.start()
                break
            line = bytes(buf[pos : match.start()])
            pos = match.end()
            self._scan = pos
            event = self._line(line)
            if event is not None:
                events.append(event)
        if pos:
            del buf[:pos]
            self._scan = max(self._scan - pos, 0)
        if len(buf) + self._data_bytes > self._max_event_bytes:
            raise SseError(f"server-sent event larger than {self._max_event_bytes} bytes")
        return events

    def _line(self, raw: bytes) -> SseEvent | None:
        if not self._started:
            self._started = True
            raw = raw.removeprefix(_BOM)
        if not raw:
            return self._dispatch()
        if raw.startswith(b":"):
            return None
        name, colon, value = raw.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        field = name.decode("utf-8", "replace")
        if field == "data":
            self._data_bytes += len(value) + 1
            if self._data_bytes > self._max_event_bytes:
                raise SseError(f"server-sent event larger than {self._max_event_bytes} bytes")
            self._data.append(value.decode("utf-8", "replace"))
        elif field == "event":
            self._event_type = value.decode("utf-8", "replace")
        elif field == "id":
            if b"\0" not in value:
                self.last_event_id = value.decode("utf-8", "replace")
        elif field == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> SseEvent | None:
        event_type, data = self._event_type or "message", self._data
        self._event_type, self._data, self._data_bytes = "", [], 0
        if not data:
            return None
        return SseEvent(event=event_type, data="\n".join(data), id=self.last_event_id)
