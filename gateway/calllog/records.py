"""The rows of the tool call log, as every producer builds them (the proxy, the playground,
ingestion): one tuple per call in the order COPY writes it, and the text and ids it holds."""

from __future__ import annotations

import functools
import operator
import uuid
from datetime import datetime
from typing import NamedTuple, overload

import uuid_utils
from asyncpg.pgproto import pgproto


class ToolCall(NamedTuple):
    """One row of tool_calls in the order of gateway.db.tool_calls.COLUMNS (COPY takes it).
    Built with keywords: fourteen positional values would read as a list of guesses."""

    id: uuid.UUID
    workspace_id: uuid.UUID
    server_id: uuid.UUID
    tool_name: str
    caller_agent: str | None
    status: str
    duration_ms: int | None
    input_tokens: int | None
    output_tokens: int | None
    output_size_bytes: int | None
    error_message: str | None
    created_at: datetime
    # The toolset the call came through (gateway/toolsets); None for the per-server proxy, the
    # playground and ingestion. Last and defaulted, so a producer without toolsets omits it.
    toolset_id: uuid.UUID | None = None
    # Its OpenTelemetry trace, 32 hex digits (gateway/ops/tracing); None when not traced.
    trace_id: str | None = None


# A ToolCall from all its values in field order, at C speed: the proxy makes one per call, and
# the keyword call costs four times as much. (Every other producer uses keywords.)
tool_call_of = functools.partial(tuple.__new__, ToolCall)

# A ToolCall's workspace_id, at C speed (an itemgetter; the field's attribute is slower).
WORKSPACE_OF = operator.itemgetter(ToolCall._fields.index("workspace_id"))


def new_call_id() -> uuid.UUID:
    """A time-ordered id (UUIDv7: new rows append to the primary key), as asyncpg's own UUID
    type, a uuid.UUID that COPY writes by copying its 16 bytes: a third of the cost of
    uuid_utils.compat.uuid7(), and no Python `.bytes` property per row in the COPY."""
    return pgproto.UUID(uuid_utils.uuid7().bytes)


@overload
def clean_text(value: str) -> str: ...
@overload
def clean_text(value: None) -> None: ...
@overload
def clean_text(value: str | None) -> str | None: ...
def clean_text(value: str | None) -> str | None:
    """Text as PostgreSQL can store it, so one row never fails a whole batch: without NUL, and
    valid UTF-8 (aiohttp hands over undecodable header bytes as lone surrogates, which cannot
    be encoded; they become U+FFFD)."""
    if value is None:
        return None
    if not value.isascii():  # a flag in CPython: free for the usual ASCII header or name
        try:
            value.encode()
        except UnicodeEncodeError:
            try:  # the bytes aiohttp could not decode, then each bad byte as U+FFFD
                raw = value.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:  # other lone surrogates (from a JSON \ud800 escape)
                raw = value.encode("utf-8", "surrogatepass")
            value = raw.decode("utf-8", "replace")
    return value.replace("\x00", "") if "\x00" in value else value
