"""The templates' filters: counted nouns and times, written one way on every page."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from importlib import resources

import pytest

from gateway.dashboard.filters import plural, when


@pytest.mark.parametrize(
    ("count", "words", "expected"),
    [
        (0, ("probe",), "0 probes"),
        (1, ("probe",), "1 probe"),
        (2, ("probe",), "2 probes"),
        (1204, ("call",), "1,204 calls"),
        (1, ("failed call",), "1 failed call"),
        (1, ("entry", "entries"), "1 entry"),
        (3, ("entry", "entries"), "3 entries"),
        (None, ("probe",), "\u2013"),
    ],
)
def test_a_count_takes_the_noun_in_its_number(
    count: int | None, words: tuple[str, ...], expected: str
) -> None:
    assert plural(count, *words) == expected


def test_times_are_in_utc_and_say_so() -> None:
    moment = datetime(2026, 11, 22, 23, 30, tzinfo=timezone(timedelta(hours=-2)))
    assert str(when(moment)) == (
        '<time datetime="2026-11-23T01:30:00+00:00">2026-11-23 01:30 UTC</time>'
    )
    assert "never" in when(None)


def test_no_template_counts_without_the_plural_filter() -> None:
    """`{{ n }} things` reads "1 things": every count with a noun goes through `plural`."""

    folder = resources.files("gateway.dashboard").joinpath("templates")
    for template in folder.iterdir():
        text = template.read_text()
        handmade = re.findall(r'\{\{ "s" if|\|\s*number\s*\}\}\s+[a-z]+s\b', text)
        assert handmade == [], (template.name, handmade)
