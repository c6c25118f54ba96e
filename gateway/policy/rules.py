"""The parts of governed access, parsed once when a key or server is loaded: permissions, tool
name patterns (globs with `*` and `?`) and rate limits (`"N/second|minute|hour|day"`).

A caller no rule applies to pays one attribute check per request: rules that restrict nothing
are None, never an empty object to consult.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

PERMISSIONS: Final = ("proxy", "ingest", "read")
ALL_PERMISSIONS: Final = frozenset(PERMISSIONS)

UNIT_SECONDS: Final = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
_RATE = re.compile(r"(\d{1,9})/(second|minute|hour|day)")

# Tool names are short (MCP: 1..128 characters); a pattern is a name with wildcards.
MAX_PATTERN: Final = 255
MAX_PATTERNS: Final = 100
# Characters that are wildcards in other glob dialects: refused, so that nobody writes
# `read_[ab]*` believing it is a character class and gets a rule that matches nothing.
_NOT_OURS = frozenset("[]{}!")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most `amount` calls per fixed window of `seconds` (aligned on the epoch)."""

    amount: int
    unit: str
    seconds: int

    def __str__(self) -> str:
        return f"{self.amount}/{self.unit}"


def parse_rate_limit(text: str) -> RateLimit:
    """`"N/second|minute|hour|day"` with N at least 1; ValueError saying what is wrong."""
    match = _RATE.fullmatch(text.strip())
    if match is None:
        raise ValueError("must be 'N/second', 'N/minute', 'N/hour' or 'N/day', e.g. '100/minute'")
    amount = int(match.group(1))
    if amount < 1:
        raise ValueError("must allow at least 1 call per window, e.g. '1/minute'")
    unit = match.group(2)
    return RateLimit(amount, unit, UNIT_SECONDS[unit])


def check_pattern(pattern: str) -> str:
    """A tool name pattern as stored; ValueError saying what is wrong."""
    if not pattern or pattern != pattern.strip():
        raise ValueError("a pattern is a tool name, optionally with * and ?, and no spaces around")
    if len(pattern) > MAX_PATTERN:
        raise ValueError(f"a pattern is at most {MAX_PATTERN} characters")
    if not pattern.isprintable():
        raise ValueError("a pattern cannot hold control characters")
    wrong = _NOT_OURS.intersection(pattern)
    if wrong:
        raise ValueError(
            f"only * (any characters) and ? (one character) are wildcards; "
            f"{''.join(sorted(wrong))!r} cannot be used"
        )
    return pattern


class ToolPatterns:
    """Tool name globs compiled into one regular expression; answers are remembered per name
    (a server has a few dozen tools, called over and over)."""

    __slots__ = ("_answers", "_regex", "patterns")

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(patterns)
        alternatives = "|".join(_translate(p) for p in self.patterns)
        self._regex = re.compile(f"(?:{alternatives})", re.DOTALL) if alternatives else None
        self._answers: dict[str, bool] = {}

    def match(self, name: str) -> bool:
        answer = self._answers.get(name)
        if answer is None:
            answer = self._regex is not None and self._regex.fullmatch(name) is not None
            if len(self._answers) < 4096:  # names come from callers: bounded
                self._answers[name] = answer
        return answer


def _translate(pattern: str) -> str:
    return "".join(
        ".*" if char == "*" else "." if char == "?" else re.escape(char) for char in pattern
    )


@dataclass(frozen=True, slots=True)
class KeyRules:
    """What an API key may do, when anything is withheld from it (else the key has None)."""

    key_id: object  # the key's id: its rate limit's budget is counted under it
    permissions: frozenset[str]
    # None: every server of the workspace, every tool.
    servers: frozenset[object] | None
    tools: ToolPatterns | None
    rate_limit: RateLimit | None

    @classmethod
    def of(
        cls,
        key_id: object,
        permissions: Iterable[str],
        servers: Iterable[object] | None,
        tools: Iterable[str] | None,
        rate_limit: str | None,
    ) -> KeyRules | None:
        """None when the key may do everything: the proxy then checks nothing for it."""
        granted = frozenset(permissions)
        if granted == ALL_PERMISSIONS and servers is None and tools is None and not rate_limit:
            return None
        return cls(
            key_id,
            granted,
            None if servers is None else frozenset(servers),
            None if tools is None else ToolPatterns(tools),
            parse_rate_limit(rate_limit) if rate_limit else None,
        )


@dataclass(frozen=True, slots=True)
class ServerRules:
    """What nobody may do with a server, when anything (else the server has None)."""

    server_id: object
    disabled: ToolPatterns | None
    rate_limit: RateLimit | None
    # Tool integrity: when the server pins its tools, the only ones that may be called (those
    # whose current definition is the approved one); None when it does not.
    pinned: frozenset[str] | None = None

    @classmethod
    def of(
        cls,
        server_id: object,
        disabled_tools: Iterable[str],
        rate_limit: str | None,
        approved_tools: Iterable[str] | None = None,
    ) -> ServerRules | None:
        patterns = tuple(disabled_tools)
        if not patterns and not rate_limit and approved_tools is None:
            return None
        return cls(
            server_id,
            ToolPatterns(patterns) if patterns else None,
            parse_rate_limit(rate_limit) if rate_limit else None,
            None if approved_tools is None else frozenset(approved_tools),
        )
