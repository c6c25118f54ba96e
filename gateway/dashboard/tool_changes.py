"""A server's tool changes: the history as readable diffs (words added and removed in a
description, schema properties added and removed), the pin switch, and the approvals a server
that pins its tools waits for."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Final

import orjson
import pydantic
from aiohttp import web

from gateway.api import servers as servers_api
from gateway.api import tool_integrity as tool_integrity_api
from gateway.api.models import Page
from gateway.api.servers import ServerPatch
from gateway.api.tool_integrity import ApproveIn
from gateway.dashboard.pages import (
    PAGE_SIZE,
    Pages,
    call,
    field_text,
    pager,
    path_id,
    redirect,
)
from gateway.db import server_tools as server_tools_db
from gateway.errors import ValidationFailed
from gateway.keys import POOL

pages = Pages()

# Longer texts are shown whole on both sides rather than compared word by word (difflib's
# matching grows with the product of the lengths).
MAX_DIFF_WORDS: Final = 3000
_TEXT_FIELDS = ("title", "description")
_SCHEMA_FIELDS = ("inputSchema", "outputSchema")


def word_diff(before: str, after: str) -> list[tuple[str, str]] | None:
    """(kind, text) runs of words, kind `same`, `removed` or `added`; None when either text is
    too long to compare."""
    old, new = before.split(), after.split()
    if len(old) > MAX_DIFF_WORDS or len(new) > MAX_DIFF_WORDS:
        return None
    runs: list[tuple[str, str]] = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            runs.append(("same", " ".join(old[i1:i2])))
            continue
        if i2 > i1:
            runs.append(("removed", " ".join(old[i1:i2])))
        if j2 > j1:
            runs.append(("added", " ".join(new[j1:j2])))
    return runs


def _compact(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _properties(schema: Any) -> dict[str, Any]:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    return dict(properties) if isinstance(properties, Mapping) else {}


def _required(schema: Any) -> set[str]:
    required = schema.get("required") if isinstance(schema, Mapping) else None
    return {str(name) for name in required} if isinstance(required, list) else set()


def _get(schema: Any, key: str) -> Any:
    return schema.get(key) if isinstance(schema, Mapping) else None


def schema_diff(before: Any, after: Any) -> dict[str, Any]:
    """Properties added, removed and changed (name, definition before and after), names that
    became required or optional, and the other keys of the schema that changed."""
    old, new = _properties(before), _properties(after)
    others: set[str] = set()
    for source in (before, after):
        if isinstance(source, Mapping):
            others.update(key for key in source if key not in ("properties", "required"))
    return {
        "added": [(name, _compact(new[name])) for name in new if name not in old],
        "removed": [(name, _compact(old[name])) for name in old if name not in new],
        "changed": [
            (name, _compact(old[name]), _compact(new[name]))
            for name in new
            if name in old and old[name] != new[name]
        ],
        "now_required": sorted(_required(after) - _required(before)),
        "now_optional": sorted(_required(before) - _required(after)),
        "other": sorted(key for key in others if _get(before, key) != _get(after, key)),
    }


def describe(change: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a change shows, field by field: a text's words, a schema's properties, any other
    field before and after. An added or removed tool shows its description and arguments."""
    before, after = change["before"] or {}, change["after"] or {}
    if change["change"] != "changed":
        tool = after or before
        shown: list[dict[str, Any]] = []
        if tool.get("description"):
            shown.append({"field": "description", "kind": "text", "text": tool["description"]})
        names = list(_properties(tool.get("inputSchema")))
        if names:
            shown.append({"field": "arguments", "kind": "names", "names": names})
        return shown
    fields: list[dict[str, Any]] = []
    for field in sorted(set(before) | set(after)):
        old, new = before.get(field), after.get(field)
        if old == new:
            continue
        if field in _TEXT_FIELDS and isinstance(old or "", str) and isinstance(new or "", str):
            runs = word_diff(old or "", new or "")
            if runs is not None:
                fields.append({"field": field, "kind": "words", "runs": runs})
                continue
        if field in _SCHEMA_FIELDS:
            fields.append({"field": field, "kind": "schema", **schema_diff(old, new)})
            continue
        fields.append(
            {
                "field": field,
                "kind": "values",
                "before": None if old is None else _compact(old),
                "after": None if new is None else _compact(new),
            }
        )
    return fields


@pages.get("/servers/{server_id}/tool-changes", "tool_changes.html")
async def tool_changes(request: web.Request) -> dict[str, Any]:
    server_id = path_id(request, "server_id", "server")
    server = await call(request, servers_api.get_server, server_id=server_id)
    try:
        offset = max(0, int(request.query.get("offset", "0")))
    except ValueError:
        offset = 0
    found = await call(
        request,
        tool_integrity_api.list_changes,
        server_id=server_id,
        query=Page(limit=PAGE_SIZE, offset=offset),
    )
    tools = await server_tools_db.tools(request.app[POOL], server_id)
    path = f"/servers/{server_id}/tool-changes"
    return {
        "section": "servers",
        "server": server,
        "changes": [{**item, "fields": describe(item)} for item in found["items"]],
        "page": pager(path, {}, offset, len(found["items"]), found["total"]),
        "waiting": [tool for tool in tools if not tool["approved"]],
        "tool_count": len(tools),
    }


@pages.post("/servers/{server_id}/tool-changes/pin")
async def pin(request: web.Request) -> web.StreamResponse:
    server_id = path_id(request, "server_id", "server")
    body = ServerPatch(pin_tools=field_text(request, "pin_tools") == "on")
    await call(request, servers_api.update_server, server_id=server_id, body=body)
    return redirect(f"/servers/{server_id}/tool-changes")


@pages.post("/servers/{server_id}/tool-changes/approve")
async def approve(request: web.Request) -> web.StreamResponse:
    server_id = path_id(request, "server_id", "server")
    name = field_text(request, "tool")
    try:
        body = ApproveIn.model_validate({"tools": [name]} if name else {})
    except pydantic.ValidationError:
        raise ValidationFailed("tool: not the name of a tool") from None
    await call(request, tool_integrity_api.approve_tools, server_id=server_id, body=body)
    return redirect(f"/servers/{server_id}/tool-changes")
