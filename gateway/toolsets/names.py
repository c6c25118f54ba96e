"""The tool names a toolset exposes: each member's prefix, names clients accept, conflicts.

A toolset shows every member's tools under one list, so names must not collide and must pass
the clients' checks. The rules, in order:

- A member's prefix is its own (`prefix`), or by default the server's name in lower case with
  every run of characters outside `[a-z0-9_]` turned into one `_`, then `__`: "GitHub Tools"
  gives `github_tools__`. `""` means no prefix.
- The exposed name is the prefix and the tool's own name, with every character outside
  `[A-Za-z0-9_-]` turned into `_` (clients such as Claude and OpenAI accept only those).
- A name longer than 64 characters (the cap of the same clients) keeps its first 55 characters
  and ends in `_` and 8 hexadecimal digits of the SHA-256 of the long name: deterministic, so
  every process and every session exposes the same name.
- When two tools come out with the same name, the first member in the toolset's order keeps
  it; the other is left out and reported as a conflict (GET /toolsets/{id}/tools).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.policy.rules import ToolPatterns

MAX_NAME: Final = 64
_DIGEST_CHARS: Final = 8
_NOT_IN_PREFIX = re.compile(r"[^a-z0-9_]+")
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_-]")


def default_prefix(server_name: str) -> str:
    """The prefix of a member without one of its own."""
    return (_NOT_IN_PREFIX.sub("_", server_name.lower()).strip("_") or "server") + "__"


def exposed_name(prefix: str, tool_name: str) -> str:
    """The name a client sees for a member's tool."""
    name = _NOT_IN_NAME.sub("_", prefix + tool_name)
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:_DIGEST_CHARS]
    return f"{name[: MAX_NAME - _DIGEST_CHARS - 1]}_{digest}"


@dataclass(frozen=True, slots=True)
class Member:
    """One server of a toolset as its names are made: its prefix and which of its tools."""

    server_id: uuid.UUID
    prefix: str
    # None: every tool of the server.
    tools: ToolPatterns | None


@dataclass(frozen=True, slots=True)
class Exposed:
    """A tool as the toolset shows it: its name there, and whose tool it is."""

    name: str
    server_id: uuid.UUID
    tool_name: str
    # The tool object as the server listed it.
    tool: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Conflict:
    """A tool left out because an earlier member's tool has the same exposed name."""

    name: str
    server_id: uuid.UUID
    tool_name: str
    kept_server_id: uuid.UUID
    kept_tool_name: str


@dataclass(frozen=True, slots=True)
class Merged:
    tools: list[Exposed]
    conflicts: list[Conflict]


def merge(lists: Iterable[tuple[Member, Sequence[dict[str, Any]]]]) -> Merged:
    """The members' tool lists, in the toolset's order, as one list of exposed names. A tool
    without a string name, or outside its member's `tools` patterns, is left out."""
    by_name: dict[str, Exposed] = {}
    conflicts: list[Conflict] = []
    for member, tools in lists:
        for tool in tools:
            tool_name = tool.get("name")
            if not isinstance(tool_name, str) or not tool_name:
                continue
            if member.tools is not None and not member.tools.match(tool_name):
                continue
            name = exposed_name(member.prefix, tool_name)
            kept = by_name.get(name)
            if kept is None:
                by_name[name] = Exposed(name, member.server_id, tool_name, tool)
            else:
                conflicts.append(
                    Conflict(name, member.server_id, tool_name, kept.server_id, kept.tool_name)
                )
    return Merged(list(by_name.values()), conflicts)
