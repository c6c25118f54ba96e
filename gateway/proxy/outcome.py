"""How each proxied exchange went: the outcome of every `tools/call` in it, judged once its
reply has passed (the call log's rows), and the exchange in the metrics."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

from aiohttp import web

from gateway.calllog.records import ToolCall, clean_text, new_call_id
from gateway.calllog.writer import CallLog, Reservation
from gateway.ops.metrics import Metrics, observe
from gateway.proxy.replies import CALLER_CANCELLED, ReplyReader
from gateway.proxy.requests import ToolCallSeen
from gateway.upstreams.servers import Upstream

# X-Caller-Agent is free text from a header; stored as the tool name is (and indexed: PostgreSQL
# refuses index entries over 2,704 bytes).
_MAX_CALLER_AGENT = 255

CALLER_HUNG_UP = f"{CALLER_CANCELLED}: it went away before the response arrived"
_NO_RESPONSE = "the upstream's reply holds no response to this call"


class Outcome:
    """How a proxied exchange went, for the call log."""

    __slots__ = (
        "answered_at",
        "calls",
        "cancelled",
        "error",
        "forwarded_at",
        "kind",
        "read_at",
        "reader",
        "size",
        "status",
    )

    def __init__(self, calls: list[ToolCallSeen]) -> None:
        self.calls = calls
        self.status = 0
        self.size = 0
        # The exchange failed on the upstream's side (unreachable, timed out, broke off), and
        # the kind of failure for the metrics.
        self.error: str | None = None
        self.kind = ""
        # perf_counter() when the request went upstream, when a streamed reply's headers
        # came, and when a buffered reply had been read whole (0.0: not yet, or not so).
        self.forwarded_at = 0.0
        self.answered_at = 0.0
        self.read_at = 0.0
        # The caller went away before the end of the reply.
        self.cancelled = False
        # Reads the reply for the calls' responses (None: no tools/call, or no reply yet).
        self.reader: ReplyReader | None = None


_METHOD_CLASSES = {"GET": "stream", "DELETE": "session_end"}


def count_exchange(
    metrics: Metrics, method: str, server_id: uuid.UUID, outcome: Outcome, started: float
) -> None:
    """The exchange in the metrics: its class, how it ended, whose time it took. Every
    proxied request pays for this: dictionary updates only, no calls it can do without."""
    forwarded = outcome.forwarded_at
    if not forwarded:
        return  # refused before it went upstream (a body too large, say)
    method_class = _METHOD_CLASSES.get(method) or ("tools_call" if outcome.calls else "request")
    if outcome.cancelled:
        result = "caller_left"
    elif outcome.kind:
        result = outcome.kind
        metrics.upstream_errors.inc(result)
    else:
        result = _STATUS_CLASSES.get(outcome.status // 100, "upstream_other")
        if outcome.status >= 500:
            metrics.upstream_errors.inc("http_5xx")
    key = (method_class, result, str(server_id)) if metrics.per_server else (method_class, result)
    counts = metrics.proxy_requests.values
    counts[key] = counts.get(key, 0) + 1
    # Buffered, the reply's body was the upstream's time too; streamed, its headers end it.
    read = outcome.read_at
    if read:
        waited = read - forwarded
        own = time.perf_counter() - started - waited
    elif outcome.answered_at:
        waited = outcome.answered_at - forwarded
        own = forwarded - started
    else:
        return  # no answer from the upstream
    upstream_time, own_time = metrics.proxy_times[method_class]
    observe(upstream_time, waited)
    observe(own_time, own)


_STATUS_CLASSES = {2: "ok", 3: "upstream_3xx", 4: "upstream_4xx", 5: "upstream_5xx"}


def _verdict(call: ToolCallSeen, outcome: Outcome) -> str | None:
    """Why the call failed, or None when it succeeded. A response that reached the caller
    decides, whatever happened to the connection afterwards."""
    answered = 200 <= outcome.status < 300
    if call.relayed and answered:
        return call.error
    if outcome.error is not None:
        return outcome.error
    if outcome.cancelled:
        return CALLER_HUNG_UP
    if not answered:
        text = f"upstream answered HTTP {outcome.status}"
        return f"{text}: {call.error}" if call.error else text
    reader = outcome.reader
    if call.rid is None or (reader is not None and (reader.blind or reader.resumable)):
        # A notification has no response; an unreadable reply is judged by its status; a
        # resumable stream may deliver the response on another request (2025-11-25 polling).
        return None
    return _NO_RESPONSE


def record_calls(
    request: web.Request,
    call_log: CallLog,
    reservation: Reservation,
    upstream: Upstream,
    outcome: Outcome,
    started: float,
    toolset_id: uuid.UUID | None = None,
) -> None:
    reader = outcome.reader
    answered_at = None if reader is None else reader.answered_at
    duration_ms = round(((answered_at or time.perf_counter()) - started) * 1000)
    caller = request.headers.get("X-Caller-Agent")
    if caller is not None:
        caller = clean_text(caller)[:_MAX_CALLER_AGENT]
    created_at = datetime.now(UTC)
    relayed_ok = 200 <= outcome.status < 300
    for call in outcome.calls:
        # The usual case first, without _verdict's call: its response reached the caller.
        error = call.error if call.relayed and relayed_ok else _verdict(call, outcome)
        call_log.add(
            ToolCall(
                id=new_call_id(),
                workspace_id=upstream.workspace_id,
                server_id=upstream.id,
                tool_name=call.name,
                caller_agent=caller,
                status="success" if error is None else "error",
                duration_ms=duration_ms,
                input_tokens=None,
                output_tokens=None,
                output_size_bytes=outcome.size,
                error_message=error,
                created_at=created_at,
                toolset_id=toolset_id,
            ),
            reservation,
        )
