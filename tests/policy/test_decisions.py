"""The decision per request, rule by rule and in the documented order."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from gateway.policy.budgets import Budgets, PostgresBudgets
from gateway.policy.decisions import (
    RATE_LIMITED,
    TOOL_REFUSED,
    Refused,
    check_server,
    check_tools,
    take_calls,
    tool_filter,
)
from gateway.policy.rules import KeyRules, ServerRules

SERVER = uuid.uuid4()
OTHER_SERVER = uuid.uuid4()


def key(**rules: object) -> KeyRules:
    made = KeyRules.of(
        uuid.uuid4(),
        rules.get("permissions", ["proxy", "ingest", "read"]),  # type: ignore[arg-type]
        rules.get("servers"),  # type: ignore[arg-type]
        rules.get("tools"),  # type: ignore[arg-type]
        rules.get("rate_limit"),  # type: ignore[arg-type]
    )
    assert made is not None
    return made


def server(disabled: list[str] | None = None, rate_limit: str | None = None) -> ServerRules:
    made = ServerRules.of(SERVER, disabled or [], rate_limit)
    assert made is not None
    return made


@pytest.fixture
async def budgets(database_url: str) -> AsyncIterator[Budgets]:
    async with asyncpg.create_pool(database_url, min_size=1, max_size=2) as pool:
        yield Budgets(PostgresBudgets(pool))


def test_a_key_without_the_proxy_permission_may_send_nothing() -> None:
    with pytest.raises(Refused, match="proxy permission") as refused:
        check_server(key(permissions=["read"]), SERVER)
    assert (refused.value.status, refused.value.code) == (403, None)


def test_a_key_scoped_to_other_servers_may_send_nothing_to_this_one() -> None:
    check_server(key(servers=[SERVER]), SERVER)
    with pytest.raises(Refused, match="may not use this server"):
        check_server(key(servers=[OTHER_SERVER]), SERVER)


def test_the_key_s_allowed_tools_are_checked_before_the_server_s_disabled_ones() -> None:
    with pytest.raises(Refused, match="not among this API key's allowed tools") as refused:
        check_tools(key(tools=["read_*"]), server(["write_*"]), ["read_a", "write_b"])
    assert refused.value.code == TOOL_REFUSED
    with pytest.raises(Refused, match="disabled on this server"):
        check_tools(key(tools=["*"]), server(["write_*"]), ["write_b"])
    check_tools(None, server(["write_*"]), ["read_a"])


async def test_a_rate_limit_refusal_says_when_to_retry(budgets: Budgets) -> None:
    limited = key(rate_limit="1/hour")
    await take_calls(budgets, limited, None, 1)
    with pytest.raises(Refused, match="rate limit of 1/hour") as refused:
        await take_calls(budgets, limited, None, 1)
    assert (refused.value.status, refused.value.code) == (429, RATE_LIMITED)
    assert refused.value.retry_after >= 1


async def test_calls_the_server_s_limit_refuses_do_not_count_against_the_key(
    budgets: Budgets,
) -> None:
    limited_key, limited_server = key(rate_limit="2/hour"), server(rate_limit="1/hour")
    await take_calls(budgets, limited_key, limited_server, 1)
    with pytest.raises(Refused, match="server's rate limit"):
        await take_calls(budgets, limited_key, limited_server, 1)
    await take_calls(budgets, limited_key, None, 1)  # the key's second call is still there


def test_the_tools_list_filter_exists_only_when_a_tool_rule_applies() -> None:
    assert tool_filter(None, None) is None
    assert tool_filter(key(rate_limit="5/minute"), server(rate_limit="5/minute")) is None
    both = tool_filter(key(tools=["read_*", "write_*"]), server(["write_secret"]))
    assert both is not None
    assert [both(n) for n in ("read_a", "write_b", "write_secret", "delete")] == [
        True,
        True,
        False,
        False,
    ]


def test_a_pinned_server_serves_only_its_approved_tools_within_the_other_rules() -> None:
    pinned = ServerRules.of(SERVER, ["write_*"], None, ["read_a", "write_b"])
    assert pinned is not None and pinned.pinned == frozenset({"read_a", "write_b"})
    check_tools(None, pinned, ["read_a"])
    with pytest.raises(Refused, match="new or has changed since") as refused:
        check_tools(None, pinned, ["read_new"])
    assert (refused.value.status, refused.value.code) == (403, TOOL_REFUSED)
    with pytest.raises(Refused, match="disabled"):  # disabled first, as documented
        check_tools(None, pinned, ["write_b"])
    alone = tool_filter(None, ServerRules.of(SERVER, [], None, ["read_a"]))
    assert alone is not None and [alone(n) for n in ("read_a", "read_b")] == [True, False]
    within = tool_filter(key(tools=["read_*", "write_*"]), pinned)
    assert within is not None
    assert [within(n) for n in ("read_a", "write_b", "read_new")] == [True, False, False]


def test_a_pinned_server_with_nothing_approved_refuses_every_tool() -> None:
    pinned = ServerRules.of(SERVER, [], None, [])
    assert pinned is not None
    with pytest.raises(Refused):
        check_tools(None, pinned, ["anything"])
    visible = tool_filter(None, pinned)
    assert visible is not None and not visible("anything")
