"""The names a toolset exposes: prefixes, names clients accept, the 64-character cap,
conflicts (the first member wins)."""

from __future__ import annotations

import re
import uuid

from gateway.policy.rules import ToolPatterns
from gateway.toolsets.names import MAX_NAME, Member, default_prefix, exposed_name, merge

ACCEPTED = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what Claude and OpenAI accept


def tool(name: str) -> dict[str, object]:
    return {"name": name, "description": "", "inputSchema": {"type": "object"}}


def test_the_default_prefix_is_the_server_s_name_in_lower_case_snake() -> None:
    assert default_prefix("GitHub Tools") == "github_tools__"
    assert default_prefix("  weird--Name!!v2 ") == "weird_name_v2__"
    assert default_prefix("日本") == "server__"


def test_names_keep_only_characters_clients_accept() -> None:
    assert exposed_name("gh__", "search.issues v2") == "gh__search_issues_v2"
    assert ACCEPTED.fullmatch(exposed_name("", "naïve/tool"))


def test_a_long_name_is_shortened_the_same_way_every_time() -> None:
    long = "x" * 100
    shortened = exposed_name("github_tools__", long)
    assert len(shortened) == MAX_NAME
    assert ACCEPTED.fullmatch(shortened)
    assert shortened == exposed_name("github_tools__", long)
    assert shortened != exposed_name("github_tools__", long + "y")
    assert exposed_name("p__", "y" * 61) == "p__" + "y" * 61  # exactly 64: kept


def test_the_first_member_keeps_a_name_two_tools_share() -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    merged = merge(
        [
            (Member(first, "", None), [tool("search"), tool("fetch")]),
            (Member(second, "", None), [tool("search"), tool("other")]),
        ]
    )
    assert [(t.name, t.server_id) for t in merged.tools] == [
        ("search", first),
        ("fetch", first),
        ("other", second),
    ]
    [conflict] = merged.conflicts
    assert (conflict.name, conflict.server_id, conflict.kept_server_id) == (
        "search",
        second,
        first,
    )


def test_a_member_s_patterns_choose_its_tools() -> None:
    member = Member(uuid.uuid4(), "gh__", ToolPatterns(["search_*"]))
    merged = merge([(member, [tool("search_code"), tool("delete_repo"), {"name": 3}])])
    assert [(t.name, t.tool_name) for t in merged.tools] == [("gh__search_code", "search_code")]
