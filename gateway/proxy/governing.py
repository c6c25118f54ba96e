"""The proxy's side of governed access (gateway/policy decides): refusals answered the way MCP
clients read them and logged as tool calls, and `tools/list` replies cut to what the caller may
call. Only requests a rule applies to come here.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiohttp import web

from gateway.calllog.writer import CallLog
from gateway.errors import Forbidden, JsonRpcRefusal
from gateway.mcp.headers import header_text
from gateway.ops.tracing import TRACE
from gateway.policy import decisions
from gateway.policy.budgets import Budgets
from gateway.policy.rules import KeyRules
from gateway.policy.tool_lists import tools_list_ids
from gateway.proxy.outcome import Outcome, record_calls
from gateway.proxy.requests import ToolCallSeen
from gateway.upstreams.servers import Upstream

# 2026-07-28: a policy-enforcing intermediary checks Mcp-Name against the body.
HEADER_MISMATCH: Final = -32020


@dataclass(frozen=True, slots=True)
class Filtering:
    """A `tools/list` request's reply: the ids of the list requests, and which tools to keep
    (None: all, the reply streams through as it comes). Its tools are fingerprinted either way
    (tool integrity), once it was relayed."""

    ids: list[Any]
    visible: Callable[[str], bool] | None = None
    # The request body, read again only when the reply is fingerprinted (which pages it asked).
    sent: bytes = b""


async def govern(
    request: web.Request,
    budgets: Budgets,
    call_log: CallLog,
    key: KeyRules | None,
    upstream: Upstream,
    body: bytes,
    calls: list[ToolCallSeen],
    started: float,
    *,
    toolset_id: uuid.UUID | None = None,
) -> Filtering | None:
    """Raises the refusal of a request the rules refuse (after logging its calls); else the
    `tools/list` requests whose reply is filtered (or only fingerprinted), if any. A toolset's
    call (`toolset_id`) has had its Mcp-Name checked against the name the client used, which
    is not the server's. Requests about a task
    (tasks/get...) call no tool: only the key's permission and servers apply to them, and a
    refusal logs no row for them."""
    if calls and any(call.about is not None for call in calls):
        calls = [call for call in calls if call.about is None]
    try:
        decisions.check_server(key, upstream.id)
        if calls:
            names = [call.name for call in calls]
            decisions.check_tools(key, upstream.rules, names)
            if toolset_id is None:
                _check_mcp_name(request, names)
            await decisions.take_calls(budgets, key, upstream.rules, len(calls))
    except decisions.Refused as refused:
        _log_refusal(request, call_log, upstream, calls, refused, started, toolset_id)
        # A toolset's client called one tool: even a refusal of the server is about that call.
        raise refusal(refused, calls, to_calls=toolset_id is not None) from None
    visible = decisions.tool_filter(key, upstream.rules)
    if not body or (visible is None and calls):
        return None  # a tools/call pays nothing more here
    ids = tools_list_ids(body)
    return None if ids is None else Filtering(ids, visible, body)


def _check_mcp_name(request: web.Request, names: list[str]) -> None:
    """A 2026-07-28 call names its tool in a header too; a server that routes by the header
    must not run another tool than the one the rules were checked against."""
    header = request.headers.get("Mcp-Name")
    if header is None or len(names) != 1:
        return
    if header_text(header) != names[0]:
        raise JsonRpcRefusal(
            400,
            HEADER_MISMATCH,
            "Header mismatch: the Mcp-Name header does not name the tool the body calls",
        )


def _log_refusal(
    request: web.Request,
    call_log: CallLog,
    upstream: Upstream,
    calls: list[ToolCallSeen],
    refused: decisions.Refused,
    started: float,
    toolset_id: uuid.UUID | None,
) -> None:
    if not calls:
        return  # nothing was called (an initialize, a GET stream): nothing to log
    # A refusal the log has no room for is still a refusal (nothing ran): answered unlogged.
    reservation = call_log.reserve(upstream.workspace_id, len(calls))
    if reservation is None:
        return
    outcome = Outcome(calls)
    outcome.status = refused.status
    outcome.error = f"refused: {refused.reason}"
    outcome.trace = request.get(TRACE)  # (while tracing is on)
    record_calls(request, call_log, reservation, upstream, outcome, started, toolset_id=toolset_id)


def refusal(
    refused: decisions.Refused, calls: list[ToolCallSeen], *, to_calls: bool = False
) -> Exception:
    """The answer to a refused request: {"detail"} for the request as a whole, a JSON-RPC
    error to each call for its calls (`to_calls`: even when the whole request is refused)."""
    headers = None
    if refused.retry_after:
        headers = {"Retry-After": str(math.ceil(refused.retry_after))}
    code = refused.code if refused.code is not None or not to_calls else decisions.TOOL_REFUSED
    if code is None or not calls:
        return Forbidden(refused.reason)
    message = f"refused by mcp-gateway: {refused.reason}"
    if len(calls) == 1:
        return JsonRpcRefusal(refused.status, code, message, calls[0].rid, headers=headers)
    # A batch is refused whole: an error for each of its calls that expects an answer.
    answer = JsonRpcRefusal(refused.status, code, message, headers=headers)
    error = {"code": code, "message": message}
    answer.body = orjson.dumps(
        [{"jsonrpc": "2.0", "id": c.rid, "error": error} for c in calls if c.rid is not None]
    )
    return answer
