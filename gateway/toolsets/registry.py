"""Toolsets as their MCP endpoint uses them, cached in-process: the members, and the index of
the names they expose.

A toolset's row and members are cached until a NOTIFY says they changed (schema.sql's triggers
on toolsets and toolset_servers). The index of exposed names is built from the members' tool
lists (the cached lists of gateway/upstreams/tool_lists.py, fetched from the servers when not
cached) and kept for GATEWAY_TOOLS_CACHE_SECONDS, or until the toolset or any server changes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

import asyncpg
from aiohttp import web

from gateway.caching.caches import MISSING, Caches, InvalidatedCache
from gateway.db import toolsets as toolsets_db
from gateway.errors import ApiError
from gateway.policy.rules import ToolPatterns
from gateway.toolsets.names import Exposed, Member, Merged, default_prefix, merge
from gateway.upstreams.servers import Upstream, Upstreams
from gateway.upstreams.tool_lists import ToolLists

# An index missing a name is built again at most this often (a call to an unknown name must
# not make every request list every member).
_REBUILD_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class MemberRules:
    server_id: uuid.UUID
    # None: the default, made from the server's name.
    prefix: str | None
    tools: ToolPatterns | None


@dataclass(frozen=True, slots=True)
class Toolset:
    id: uuid.UUID
    workspace_id: uuid.UUID
    name: str
    members: tuple[MemberRules, ...]


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A member whose tools could not be listed."""

    server_id: uuid.UUID
    detail: str


@dataclass(frozen=True, slots=True)
class Listing:
    """A toolset's tools as its members listed them now (or as cached)."""

    merged: Merged
    unavailable: list[Unavailable]
    # The members as reached: server id -> upstream (a member deleted meanwhile is absent).
    upstreams: dict[uuid.UUID, Upstream]


class Toolsets:
    """toolset id -> Toolset, and toolset id -> the Listing its names route by."""

    def __init__(
        self, pool: asyncpg.Pool, caches: Caches, upstreams: Upstreams, *, index_seconds: float
    ) -> None:
        self._pool = pool
        self._upstreams = upstreams
        self._index_seconds = index_seconds
        self._cache: InvalidatedCache[uuid.UUID, Toolset | None] = InvalidatedCache("toolsets")
        # toolset id -> (its listing, names -> tools, when built)
        self._indexes: dict[uuid.UUID, tuple[Listing, dict[str, Exposed], float]] = {}
        caches.register(
            self,
            {
                "toolsets": self._changed,
                "toolset_servers": self._changed,
                # A server's name is its tools' prefix; its url or rules change what it lists.
                "servers": lambda _key: self._indexes.clear(),
            },
        )

    # Caches.set_listening turns caching on and off, and clears, for both.
    @property
    def enabled(self) -> bool:
        return self._cache.enabled

    @enabled.setter
    def enabled(self, enabled: bool) -> None:
        self._cache.enabled = enabled

    def clear(self) -> None:
        self._cache.clear()
        self._indexes.clear()

    async def get(self, toolset_id: uuid.UUID, workspace_id: uuid.UUID) -> Toolset | None:
        """The toolset, or None when it does not exist or belongs to another workspace."""
        toolset = self._cache.peek(toolset_id)
        if toolset is MISSING:
            toolset = await self._cache.get(toolset_id, lambda: self._load(toolset_id))
        if toolset is None or toolset.workspace_id != workspace_id:
            return None
        return toolset

    async def listing(self, toolset: Toolset, tool_lists: ToolLists) -> Listing:
        """Every member's tools under the toolset's names, fetched concurrently; a member that
        cannot be listed is reported, never failing the rest."""
        upstreams: dict[uuid.UUID, Upstream] = {}
        members: list[Member] = []
        for rules in toolset.members:
            upstream = await self._upstreams.get(rules.server_id, toolset.workspace_id)
            if upstream is None:
                continue  # deleted meanwhile: it left the toolset
            upstreams[upstream.id] = upstream
            prefix = default_prefix(upstream.name) if rules.prefix is None else rules.prefix
            members.append(Member(upstream.id, prefix, rules.tools))
        results = await asyncio.gather(
            *(tool_lists.get(upstreams[member.server_id]) for member in members),
            return_exceptions=True,
        )
        lists = []
        unavailable = []
        for member, result in zip(members, results, strict=True):
            if isinstance(result, ApiError):
                unavailable.append(Unavailable(member.server_id, result.detail))
            elif isinstance(result, BaseException):
                raise result
            else:
                # A tool nobody may call is no part of the toolset: it takes no name.
                server_rules = upstreams[member.server_id].rules
                disabled = None if server_rules is None else server_rules.disabled
                tools = result.tools
                if disabled is not None:
                    tools = [tool for tool in tools if not disabled.match(tool["name"])]
                lists.append((member, tools))
        listing = Listing(merge(lists), unavailable, upstreams)
        by_name = {tool.name: tool for tool in listing.merged.tools}
        self._indexes[toolset.id] = (listing, by_name, time.monotonic())
        return listing

    async def find(
        self, toolset: Toolset, name: str, tool_lists: ToolLists
    ) -> tuple[Exposed | None, Listing]:
        """The tool a client's name stands for (None: no such tool now), from the index, which
        is built again when it is old or does not know the name."""
        entry = self._indexes.get(toolset.id)
        if entry is not None:
            listing, names, built = entry
            age = time.monotonic() - built
            tool = names.get(name)
            fresh = age < self._index_seconds and self._cache.enabled
            if fresh and (tool is not None or age < _REBUILD_SECONDS):
                return tool, listing
        listing = await self.listing(toolset, tool_lists)
        return self._indexes[toolset.id][1].get(name), listing

    def forget(self, toolset_id: uuid.UUID) -> None:
        """Drop a toolset changed by this process (the others hear of it by NOTIFY)."""
        self._cache.drop(toolset_id)
        self._indexes.pop(toolset_id, None)

    def _changed(self, key: str) -> None:
        self.forget(uuid.UUID(key))

    async def _load(self, toolset_id: uuid.UUID) -> Toolset | None:
        row = await toolsets_db.load(self._pool, toolset_id)
        if row is None:
            return None
        return Toolset(
            row.id,
            row.workspace_id,
            row.name,
            tuple(
                MemberRules(
                    m.server_id, m.prefix, None if m.tools is None else ToolPatterns(m.tools)
                )
                for m in row.members
            ),
        )


# Every toolset as the endpoint and the API read them (made with the caches, before the
# listener starts: NOTIFY must reach it from the first request on).
TOOLSETS: web.AppKey[Toolsets] = web.AppKey("toolsets")
