"""The templates' filters: times, durations, percentages, numbers and counted nouns, each
written one way on every page."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup

_NONE = "\u2013"  # an en dash: no value


def when(moment: datetime | None) -> Markup:
    """A time in UTC, saying so. Every page speaks UTC, as the tool-call filters do: a page
    cannot know the browser's time zone without script, and two zones on one page (filters
    in one, the list in the other) made the filters look wrong."""
    if moment is None:
        return Markup('<span class="muted">never</span>')
    utc = moment.astimezone(UTC)
    return Markup(f'<time datetime="{utc.isoformat()}">{utc.strftime("%Y-%m-%d %H:%M")} UTC</time>')


def milliseconds(value: float | None) -> str:
    if value is None:
        return _NONE
    if value >= 10_000:
        return f"{value / 1000:.1f} s"
    if value >= 100:
        return f"{value:,.0f} ms"
    return f"{value:.1f} ms".replace(".0 ms", " ms")


def percent(value: float | None, digits: int = 1) -> str:
    """A fraction 0..1 as a percentage."""
    return _NONE if value is None else f"{value * 100:.{digits}f} %"


def number(value: float | None) -> str:
    return _NONE if value is None else f"{value:,.0f}"


def plural(count: int | None, singular: str, plural: str | None = None) -> str:
    """A count with its noun: "1 probe", "0 probes", "1,204 probes"; `plural` for a noun
    that is not made by adding an s ("1 entry", "2 entries")."""
    if count is None:
        return _NONE
    noun = singular if count == 1 else plural or f"{singular}s"
    return f"{number(count)} {noun}"


def refusal(call: Mapping[str, Any]) -> bool:
    """Whether a tool call is a refusal of the gateway's rules (as db.tool_calls.REFUSED
    selects them): an error logged as "refused: ..."."""
    message = call.get("error_message") or ""
    return call.get("status") == "error" and message.startswith("refused:")


FILTERS: dict[str, Callable[..., Any]] = {
    "when": when,
    "ms": milliseconds,
    "percent": percent,
    "number": number,
    "plural": plural,
    "refusal": refusal,
}
