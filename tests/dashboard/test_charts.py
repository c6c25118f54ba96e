"""Charts drawn on the server: a line needs two points, and says so until it has them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gateway.dashboard import charts

HOURS = [datetime(2026, 11, 22, tzinfo=UTC) + timedelta(hours=i) for i in range(24)]


def test_a_sparkline_with_fewer_than_two_points_says_not_enough_data() -> None:
    for values in ([], [None] * 24, [None] * 23 + [12.5]):
        drawn = charts.sparkline(values, label="latency")
        assert "not enough data yet" in drawn and "<svg" not in drawn, values
    drawn = charts.sparkline([None] * 22 + [12.5, 14.0], label="latency")
    assert "<polyline" in drawn and "not enough data" not in drawn


def test_a_line_chart_with_fewer_than_two_hours_says_not_enough_data() -> None:
    one_hour = {"p50": [None] * 23 + [5.0], "p95": [None] * 23 + [9.0]}
    drawn = charts.lines(HOURS, one_hour, label="latency <per hour>", unit=" ms")
    assert "not enough data yet" in drawn and "<svg" not in drawn
    assert 'aria-label="latency &lt;per hour&gt;"' in drawn  # still named, and escaped
    two_hours = {"p50": [None] * 22 + [5.0, 6.0], "p95": [None] * 22 + [9.0, 8.0]}
    drawn = charts.lines(HOURS, two_hours, label="latency", unit=" ms")
    assert drawn.count("<polyline") == 2 and "not enough data" not in drawn


def test_bars_show_every_hour_with_calls() -> None:
    drawn = charts.bars(HOURS, [0] * 23 + [3], label="calls", unit=" calls")
    assert drawn.count("<rect") == 1 and "2026-11-22 23:00 UTC: 3 calls" in drawn
