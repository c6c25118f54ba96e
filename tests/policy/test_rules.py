"""The parts of governed access: tool name globs, rate limits, and rules that restrict nothing
being no rules at all (so the proxy checks nothing for their callers)."""

from __future__ import annotations

import uuid

import pytest

from gateway.policy.rules import (
    KeyRules,
    ServerRules,
    ToolPatterns,
    check_pattern,
    parse_rate_limit,
)


@pytest.mark.parametrize(
    ("patterns", "name", "matches"),
    [
        (["read_*"], "read_file", True),
        (["read_*"], "write_file", False),
        (["get?"], "get1", True),
        (["get?"], "get12", False),
        (["a.b"], "aXb", False),  # a dot is a dot, not a regular expression's any character
        (["*"], "anything/at all", True),
        (["files/*", "search"], "search", True),
        (["files/*", "search"], "searching", False),
        ([], "read_file", False),
    ],
)
def test_tool_patterns_match_whole_names_with_star_and_question_mark(
    patterns: list[str], name: str, matches: bool
) -> None:
    assert ToolPatterns(patterns).match(name) is matches


@pytest.mark.parametrize("pattern", ["", " read", "read_[ab]", "{a,b}", "!x", "a\nb", "x" * 256])
def test_a_pattern_outside_the_glob_syntax_is_refused_with_a_reason(pattern: str) -> None:
    with pytest.raises(ValueError, match=r"\w"):
        check_pattern(pattern)


@pytest.mark.parametrize(
    ("text", "amount", "seconds"),
    [("1/second", 1, 1), ("100/minute", 100, 60), ("5/hour", 5, 3600), ("7/day", 7, 86400)],
)
def test_rate_limits_are_n_per_unit(text: str, amount: int, seconds: int) -> None:
    limit = parse_rate_limit(text)
    assert (limit.amount, limit.seconds, str(limit)) == (amount, seconds, text)


@pytest.mark.parametrize("text", ["0/minute", "10/week", "ten/minute", "-1/second", "5 per hour"])
def test_a_rate_limit_that_is_not_n_per_unit_with_n_at_least_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"at least 1|N/minute"):
        parse_rate_limit(text)


def test_a_key_that_may_do_everything_has_no_rules() -> None:
    key = uuid.uuid4()
    assert KeyRules.of(key, ["read", "proxy", "ingest"], None, None, None) is None
    rules = KeyRules.of(key, ["proxy"], None, ["read_*"], "10/minute")
    assert rules is not None
    assert rules.permissions == {"proxy"}
    assert rules.tools is not None and rules.tools.match("read_x")
    assert str(rules.rate_limit) == "10/minute"


def test_a_server_without_disabled_tools_or_limit_has_no_rules() -> None:
    server = uuid.uuid4()
    assert ServerRules.of(server, [], None) is None
    rules = ServerRules.of(server, ["delete_*"], None)
    assert rules is not None and rules.disabled is not None and rules.disabled.match("delete_x")
