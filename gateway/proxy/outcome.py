"""How each proxied exchange went: the outcome of every `tools/call` in it, judged once its
reply has passed (the call log's rows: none for a reply that is not the call's end, see
gateway/proxy/tasks.py), and the exchange in the metrics."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

from aiohttp import web

from gateway.accounts.access import PRINCIPAL
from gateway.calllog.records import clean_text, new_call_id, tool_call_of
from gateway.calllog.writer import CallLog, Reservation
from gateway.ops.metrics import Metrics, observe
from gateway.ops.tracing import Trace
from gateway.proxy.replies import CALLER_CANCELLED, ReplyReader
from gateway.proxy.requests import ToolCallSeen
from gateway.proxy.tasks import TaskFollower
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
        "reservation",
        "size",
        "started",
        "status",
        "toolset_id",
        "trace",
    )

    def __init__(
        self,
        calls: list[ToolCallSeen],
        started: float = 0.0,
        reservation: Reservation | None = None,
        toolset_id: uuid.UUID | None = None,
    ) -> None:
        self.calls = calls
        # perf_counter() when the request arrived, the calls' room in the call log, and the
        # toolset they came through (for the calls that turn into tasks while the reply is
        # read: gateway/proxy/tasks).
        self.started = started
        self.reservation = reservation
        self.toolset_id = toolset_id
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
        # The request's trace, while tracing is on (gateway/ops/tracing).
        self.trace: Trace | None = None


_METHOD_CLASSES = {"GET": "stream", "DELETE": "session_end"}


def count_exchange(
    metrics: Metrics, method: str, server_id: uuid.UUID, outcome: Outcome, started: float
) -> None:
    """The exchange in the metrics: its class, how it ended, whose time it took. Every
    proxied request pays for this: dictionary updates only, no calls it can do without."""
    forwarded = outcome.forwarded_at
    if not forwarded:
        return  # refused before it went upstream (a body too large, say)
    calls = outcome.calls
    # A request about a task (tasks/get...) may carry a call's end, but is a request of its own.
    method_class = _METHOD_CLASSES.get(method) or (
        "tools_call" if calls and calls[0].about is None else "request"
    )
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


def caller_agent(request: web.Request) -> str | None:
    """X-Caller-Agent, as the call log stores it; without one, an OAuth token's client name
    (so the log tells Claude from ChatGPT from your own agents)."""
    caller = request.headers.get("X-Caller-Agent")
    if caller is None:
        # (Every MCP route authenticates first. Not request.get(): twice the cost, paid by
        # every API key's call that sends no header.)
        caller = request[PRINCIPAL].client_name
        if caller is None:
            return None
    return clean_text(caller)[:_MAX_CALLER_AGENT]


def record_calls(
    request: web.Request,
    call_log: CallLog,
    reservation: Reservation,
    upstream: Upstream,
    outcome: Outcome,
    started: float,
    tasks: TaskFollower | None = None,
    toolset_id: uuid.UUID | None = None,
) -> None:
    """A row for each call of the exchange that ended with it, and the room reserved for
    the others given back (or handed to `tasks`: the ends of calls that became tasks).
    duration_ms runs from the request's arrival until the call's response was passed on:
    for a call answered `input_required` first, that is its last exchange, the retry."""
    reader = outcome.reader
    answered_at = None if reader is None else reader.answered_at
    duration_ms = round(((answered_at or time.perf_counter()) - started) * 1000)
    caller = caller_agent(request)
    created_at = datetime.now(UTC)
    trace = outcome.trace
    trace_id = None if trace is None else trace.trace_id
    relayed_ok = 200 <= outcome.status < 300
    ended: list[ToolCallSeen] = []
    for call in outcome.calls:
        if call.interim or call.about is not None or call.handed:  # (rare: one test if not)
            if call.handed:
                continue  # a call that became a task: `tasks` accounts for its room
            if call.about is not None:
                # A request about a task: no row of its own; a reply that ended the task and
                # reached the caller is the end of the call the task stands for.
                if not call.interim and call.relayed and relayed_ok:
                    ended.append(call)
                else:
                    call_log.release(reservation)
                continue
            if call.relayed and relayed_ok and call.task_id is None:
                # Answered `input_required`: the client retries the same call, which is
                # logged when that retry ends. (Not passed on, it is judged like any reply.)
                call_log.release(reservation)
                continue
        # The usual case first, without _verdict's call: its response reached the caller.
        error = call.error if call.relayed and relayed_ok else _verdict(call, outcome)
        call_log.add(
            tool_call_of(
                (
                    new_call_id(),  # id
                    upstream.workspace_id,
                    upstream.id,  # server_id
                    call.name,  # tool_name
                    caller,  # caller_agent
                    "success" if error is None else "error",  # status
                    duration_ms,
                    None,  # input_tokens
                    None,  # output_tokens
                    outcome.size,  # output_size_bytes
                    error,  # error_message
                    created_at,
                    toolset_id,
                    trace_id,
                )
            ),
            reservation,
        )
        if trace is not None:
            trace.log(error, outcome.kind)
    if ended:
        if tasks is None:
            call_log.release(reservation, len(ended))
        else:
            tasks.settle(upstream, ended, reservation, outcome.size)
