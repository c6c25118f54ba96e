"""/tool-calls: the tool call audit log, listed with filters and filled by direct ingestion."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, NotRequired

import pydantic
from aiohttp import web
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)
from typing_extensions import TypedDict

from gateway.accounts.access import PRINCIPAL, READ, USE
from gateway.api.models import (
    TRIMMED,
    WHOLE,
    Documented,
    Out,
    Page,
    QueryTimestamp,
    Timestamp,
)
from gateway.api.routing import (
    Routes,
    check_json,
    json_response,
    read_bytes,
    validation_detail,
)
from gateway.calllog.records import ToolCall, clean_text, new_call_id
from gateway.calllog.writer import CALL_LOG
from gateway.db import tool_calls as tool_calls_db
from gateway.db.partitions import FUTURE_SLACK
from gateway.db.rollups import floor_hour
from gateway.db.types import BIGINT_MAX
from gateway.errors import BadRequest, Forbidden, NotFound, ValidationFailed
from gateway.keys import POOL, SETTINGS
from gateway.upstreams.servers import UPSTREAMS

routes = Routes("tool calls")

MAX_BATCH = 1000
_INT32 = 2**31 - 1

ToolName = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=255),
    Documented(TRIMMED),
]
# Indexed with the workspace (and in the rollups' keys): PostgreSQL refuses index entries over
# 2,704 bytes, which 1,000 characters of CJK text would reach.
CallerAgent = Annotated[str, StringConstraints(max_length=255)]
Count = Annotated[int, Field(ge=0, le=_INT32), WHOLE]
Status = Literal["success", "error"]

CREATED_AT = (
    "When the call was made; the time of receipt when absent (a timestamp without an offset "
    "is UTC). It must lie within the tool call retention (GATEWAY_TOOL_CALL_RETENTION_DAYS, "
    "30 days by default: older calls are no longer kept) and at most 1 hour ahead of the "
    "gateway's clock, else 422."
)


TRACE_ID = (
    "The call's OpenTelemetry trace id, 32 lowercase hex digits (W3C trace context; not all "
    "zeros): the gateway's own trace for a call it proxied while tracing is on (OTEL_* "
    "variables, docs/operations.md), or the one an ingesting client sent; else null. The "
    "dashboard links it to GATEWAY_TRACE_URL."
)


def _valid_trace(value: str) -> str:
    if value == "0" * 32:
        raise ValueError("an all-zero trace id is not a trace (W3C trace context)")
    return value


TraceId = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9a-f]{32}$"),
    AfterValidator(_valid_trace),
    # (The document says so too: pydantic's pattern engine has no lookahead to say it there.)
    WithJsonSchema({"type": "string", "pattern": "^[0-9a-f]{32}$", "not": {"const": "0" * 32}}),
]


class ToolCallIn(TypedDict):
    """One tool call to ingest. A TypedDict rather than a model: 2.5 times faster to validate,
    which matters at tens of thousands of rows per second. No `toolset_id`: only the gateway
    knows that a call came through a toolset (see TOOLSET_ID); like any field not listed here,
    one sent is ignored, and the call is stored without a toolset."""

    __pydantic_config__ = ConfigDict(strict=True, extra="ignore")  # type: ignore[misc]

    server_id: uuid.UUID
    tool_name: ToolName
    status: Status
    caller_agent: NotRequired[CallerAgent | None]
    duration_ms: NotRequired[Count | None]
    input_tokens: NotRequired[Count | None]
    output_tokens: NotRequired[Count | None]
    output_size_bytes: NotRequired[Annotated[int, Field(ge=0, le=BIGINT_MAX), WHOLE] | None]
    error_message: NotRequired[Annotated[str, StringConstraints(max_length=10_000)] | None]
    # Naive timestamps are taken as UTC; absent means the time of receipt. Bounded by
    # _check_times(): every day accepted has its partition of tool_calls.
    created_at: NotRequired[Annotated[Timestamp | None, Field(description=CREATED_AT)]]
    trace_id: NotRequired[Annotated[TraceId | None, Field(description=TRACE_ID)]]


# What the document says of an array body (ingest checks it itself).
Batch = Annotated[list[ToolCallIn], Field(min_length=1, max_length=MAX_BATCH)]


TOOLSET_ID = (
    "The toolset the call came through (its MCP endpoint, /api/v1/toolsets/{id}/mcp), which "
    "sent it to `server_id` under the tool's own name `tool_name`; null for a call through the "
    "server's own proxy URL, the playground or ingestion (POST /tool-calls never sets it). A "
    "deleted toolset's calls keep its id."
)


class ToolCallOut(Out):
    id: uuid.UUID
    server_id: uuid.UUID
    server_name: str
    tool_name: str
    caller_agent: str | None
    status: Status
    duration_ms: int | None
    input_tokens: int | None
    output_tokens: int | None
    output_size_bytes: int | None
    error_message: str | None
    created_at: datetime
    toolset_id: uuid.UUID | None = Field(description=TOOLSET_ID)
    trace_id: str | None = Field(description=TRACE_ID)


class ToolCallsCreated(Out):
    items: list[ToolCallOut]


class ToolCallPage(Out):
    items: list[ToolCallOut]
    total: int


class ToolCallQuery(Page):
    server_id: uuid.UUID | None = None
    tool_name: Annotated[
        str | None, Field(max_length=255, description="case-insensitive substring")
    ] = None
    caller_agent: str | None = None
    status: Status | None = None
    refused: Annotated[
        bool | None,
        Field(
            description="true: only refusals (calls the gateway's rules stopped: status `error`, "
            "`error_message` starting `refused:`); false: every call but them"
        ),
    ] = None
    toolset_id: Annotated[
        uuid.UUID | None,
        Field(
            description="only calls that came through this toolset (one not in your workspace "
            "matches none)"
        ),
    ] = None
    start: Annotated[QueryTimestamp | None, Field(description="from this time on (inclusive)")] = (
        None
    )
    end: Annotated[QueryTimestamp | None, Field(description="up to this time (inclusive)")] = None

    @model_validator(mode="after")
    def _range(self) -> ToolCallQuery:
        if self.start is not None and self.end is not None and self.end < self.start:
            raise ValueError("end must not be before start")
        return self


_ONE = pydantic.TypeAdapter(ToolCallIn)
_MANY = pydantic.TypeAdapter(list[ToolCallIn])


def _parse(raw: bytes) -> tuple[list[ToolCallIn], bool]:
    """The tool calls of a body, and whether it was an array. A custom read rather than the
    routing's: validating a union of object and array would name fields awkwardly."""
    first = raw.lstrip()[:1]
    if not first:
        raise BadRequest("request body is required (JSON)")
    if first not in (b"{", b"["):
        raise BadRequest("request body must be a JSON object or an array of objects")
    many = first == b"["
    try:
        calls = _MANY.validate_json(raw) if many else [_ONE.validate_json(raw)]
    except pydantic.ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors(include_url=False)):
            raise BadRequest("request body is not valid JSON") from None
        raise ValidationFailed(validation_detail(exc, "body")) from None
    if many and not calls:
        raise ValidationFailed("body: the array must hold at least one tool call")
    if len(calls) > MAX_BATCH:
        raise ValidationFailed(f"body: at most {MAX_BATCH} tool calls per request")
    return calls, many


@routes.post(
    "/tool-calls",
    summary="Ingest tool calls without the proxy",
    access=USE,
    status=201,
    response=ToolCallOut | ToolCallsCreated,
    errors=(400, 403, 404, 408, 413, 415, 422),
    request_body=ToolCallIn
    | Annotated[list[ToolCallIn], Field(min_length=1, max_length=MAX_BATCH)],
)
async def ingest(request: web.Request) -> web.Response:
    """The body is one tool call object (answered with the stored call) or an array of up to
    1000 (answered with `{"items": [...]}`), each with the fields of ToolCallIn: `server_id`,
    `tool_name` and `status` required; `created_at` defaults to the time of receipt. Every
    server must be in your workspace (else 404, and nothing is stored). A 201 means the calls
    are committed: a following GET /tool-calls sees them. An API key needs the `ingest`
    permission, and every `server_id` within its `allowed_servers` (else 403, and nothing is
    stored). Ingested calls have `toolset_id` null: a `toolset_id` in the body is ignored, as
    only the gateway's toolset endpoint knows which calls came through it."""
    rules = request[PRINCIPAL].rules
    if rules is not None and "ingest" not in rules.permissions:
        raise Forbidden("this API key does not have the ingest permission")
    raw = await read_bytes(request)
    check_json(request, raw)
    calls, many = _parse(raw)
    app = request.app
    now = datetime.now(UTC)
    _check_times(calls, many, now, app[SETTINGS].tool_call_retention_days)
    workspace_id = request[PRINCIPAL].workspace_id
    names: dict[uuid.UUID, str] = {}
    for server_id in {call["server_id"] for call in calls}:
        upstream = await app[UPSTREAMS].get(server_id, workspace_id)
        if upstream is None:
            raise NotFound(f"server {server_id} not found")
        if rules is not None and rules.servers is not None and server_id not in rules.servers:
            raise Forbidden(f"this API key may not use server {server_id}")
        names[server_id] = upstream.name
    records = [
        ToolCall(
            id=call_id,
            workspace_id=workspace_id,
            server_id=call["server_id"],
            tool_name=clean_text(call["tool_name"]) or "(unnamed)",
            caller_agent=clean_text(call.get("caller_agent")),
            status=call["status"],
            duration_ms=call.get("duration_ms"),
            input_tokens=call.get("input_tokens"),
            output_tokens=call.get("output_tokens"),
            output_size_bytes=call.get("output_size_bytes"),
            error_message=clean_text(call.get("error_message")),
            created_at=call.get("created_at") or now,
            trace_id=call.get("trace_id"),
        )
        for call_id, call in ((new_call_id(), call) for call in calls)
    ]
    await app[CALL_LOG].write(records)
    items = [_stored(record, names[record.server_id]) for record in records]
    return json_response({"items": items} if many else items[0], 201)


def _check_times(
    calls: Sequence[ToolCallIn], many: bool, now: datetime, retention_days: int
) -> None:
    """Refuse a created_at older than the retention (it would be dropped at once, or find its
    day's partition gone) or further ahead than FUTURE_SLACK (its day may have no partition
    yet; a clock that far off is a mistake worth hearing of)."""
    oldest = now - timedelta(days=retention_days)
    newest = now + FUTURE_SLACK
    for index, call in enumerate(calls):
        created_at = call.get("created_at")
        if created_at is None or oldest <= created_at <= newest:
            continue
        where = f"body.{index}.created_at" if many else "body.created_at"
        if created_at < oldest:
            raise ValidationFailed(
                f"{where}: is older than the tool call retention ({retention_days} days): "
                "such calls are no longer kept"
            )
        raise ValidationFailed(f"{where}: is more than 1 hour in the future")


def _stored(record: ToolCall, server_name: str) -> dict[str, Any]:
    return {
        "id": record.id,
        "server_id": record.server_id,
        "server_name": server_name,
        "tool_name": record.tool_name,
        "caller_agent": record.caller_agent,
        "status": record.status,
        "duration_ms": record.duration_ms,
        "input_tokens": record.input_tokens,
        "output_tokens": record.output_tokens,
        "output_size_bytes": record.output_size_bytes,
        "error_message": record.error_message,
        "created_at": record.created_at,
        "toolset_id": record.toolset_id,
        "trace_id": record.trace_id,
    }


@routes.get(
    "/tool-calls",
    summary="Tool calls of the workspace, newest first",
    access=READ,
    response=ToolCallPage,
)
async def list_tool_calls(request: web.Request, query: ToolCallQuery) -> dict[str, Any]:
    """`tool_name` matches any part of the name, ignoring case; `start` and `end` bound
    `created_at` (both inclusive; timestamps without an offset are UTC); `refused` keeps or
    leaves out the calls refused by key scopes, tool rules and rate limits; `toolset_id` keeps
    the calls that came through that toolset. `total` is exact.
    Calls are listed while they are kept: from the start of the hour
    GATEWAY_TOOL_CALL_RETENTION_DAYS (30 by default) ago; an earlier `start` starts there."""
    # Whole days of calls are dropped some time after they expire, while their hourly rollups
    # stay much longer: a fixed horizon, on an hour (no partial hour to count), keeps the page
    # and its total (summed from the rollups) about exactly the same calls, whatever is
    # still stored.
    retention = timedelta(days=request.app[SETTINGS].tool_call_retention_days)
    kept_since = floor_hour(datetime.now(UTC) - retention)
    filters = tool_calls_db.Filters(
        server_id=query.server_id,
        tool_name=query.tool_name,
        caller_agent=query.caller_agent,
        status=query.status,
        refused=query.refused,
        toolset_id=query.toolset_id,
        start=kept_since if query.start is None else max(query.start, kept_since),
        end=query.end,
    )
    return await tool_calls_db.list_tool_calls(
        request.app[POOL], request[PRINCIPAL].workspace_id, filters, query.limit, query.offset
    )
