"""The one decision per proxied request: may this caller send these calls to this server now?

Rules apply in this order, and the first that refuses decides:

1. the key's permissions (`proxy`), then its `allowed_servers`: refused for every method;
2. each `tools/call`'s tool against the key's `allowed_tools`, then the server's
   `disabled_tools`, then (a server that pins its tools) its approved tools;
3. the key's rate limit, then the server's (calls refused by the second are given back to
   the first).

A caller whose key and server have no rules (None) never comes here. Members signed in with a
JWT have no key rules; the server's apply to them as to everyone.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Final

from gateway.policy.budgets import Budgets
from gateway.policy.rules import KeyRules, RateLimit, ServerRules, ToolPatterns

# JSON-RPC error codes of the gateway's refusals (API_DECISIONS, "Governed access").
TOOL_REFUSED: Final = -32003
RATE_LIMITED: Final = -32029

_NOT_APPROVED = (
    "tool {name!r} is new or has changed since the server's tools were approved "
    "(pinned tools: an admin approves it in the dashboard or POST /servers/{{id}}/tools/approve)"
)


class Refused(Exception):
    """A request the rules refuse: nothing of it is forwarded. `reason` completes the call
    log's "refused: ..."; `code` is the JSON-RPC error code when the answer is MCP-style
    (None: a plain {"detail": ...})."""

    def __init__(
        self, status: int, reason: str, *, code: int | None = None, retry_after: float = 0.0
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.code = code
        self.retry_after = retry_after


def check_proxy(key: KeyRules | None) -> None:
    """Rule 1, first half: whether the key may send anything through the gateway."""
    if key is not None and "proxy" not in key.permissions:
        raise Refused(403, "this API key does not have the proxy permission")


def check_server(key: KeyRules | None, server_id: uuid.UUID) -> None:
    """Rule 1: whether the key may send anything to this server."""
    if key is None:
        return
    check_proxy(key)
    if key.servers is not None and server_id not in key.servers:
        raise Refused(403, "this API key may not use this server")


def check_tools(key: KeyRules | None, server: ServerRules | None, names: Sequence[str]) -> None:
    """Rule 2: whether every tool called may be called."""
    for name in names:
        if key is not None and key.tools is not None and not key.tools.match(name):
            raise Refused(
                403, f"tool {name!r} is not among this API key's allowed tools", code=TOOL_REFUSED
            )
        if server is not None:
            if server.disabled is not None and server.disabled.match(name):
                raise Refused(403, f"tool {name!r} is disabled on this server", code=TOOL_REFUSED)
            if server.pinned is not None and name not in server.pinned:
                raise Refused(403, _NOT_APPROVED.format(name=name), code=TOOL_REFUSED)


async def take_calls(
    budgets: Budgets, key: KeyRules | None, server: ServerRules | None, calls: int
) -> None:
    """Rule 3: the calls counted against the key's and the server's rate limits."""
    key_limit = None if key is None else key.rate_limit
    server_limit = None if server is None else server.rate_limit
    if key_limit is not None:
        assert key is not None
        subject = _subject("key", key.key_id, key_limit)
        wait = await budgets.take(subject, key_limit, calls)
        if wait:
            raise _limited(f"this API key's rate limit of {key_limit} is reached", wait)
    if server_limit is not None:
        assert server is not None
        subject = _subject("server", server.server_id, server_limit)
        wait = await budgets.take(subject, server_limit, calls)
        if wait:
            if key_limit is not None:
                assert key is not None
                budgets.give_back(_subject("key", key.key_id, key_limit), key_limit, calls)
            raise _limited(f"the server's rate limit of {server_limit} is reached", wait)


def tool_filter(key: KeyRules | None, server: ServerRules | None) -> Callable[[str], bool] | None:
    """Which tools a `tools/list` reply may show this caller; None: all of them (the reply
    then passes byte for byte)."""
    allowed = None if key is None else key.tools
    disabled = None if server is None else server.disabled
    if server is not None and server.pinned is not None:
        return _pinned_filter(allowed, disabled, server.pinned)
    if allowed is None and disabled is None:
        return None
    if disabled is None:
        assert allowed is not None
        return allowed.match
    if allowed is None:
        return lambda name: not disabled.match(name)
    return lambda name: allowed.match(name) and not disabled.match(name)


def _pinned_filter(
    allowed: ToolPatterns | None, disabled: ToolPatterns | None, approved: frozenset[str]
) -> Callable[[str], bool]:
    """A server that pins its tools shows only the approved ones, within the other rules."""
    if allowed is None and disabled is None:
        return approved.__contains__
    return lambda name: (
        name in approved
        and (allowed is None or allowed.match(name))
        and (disabled is None or not disabled.match(name))
    )


def _subject(kind: str, owner: object, limit: RateLimit) -> str:
    # The unit is part of the subject: a limit changed from per minute to per hour starts a
    # budget of its own rather than reading the other's count.
    return f"{kind}:{owner}:{limit.unit}"


def _limited(reason: str, wait: float) -> Refused:
    return Refused(429, reason, code=RATE_LIMITED, retry_after=wait)
