"""Charts drawn on the server as inline SVG: no script, no chart library, nothing to download.

Colours come from classes styled in static/app.css (the CSP allows no inline style); every
chart has a text alternative, and each bar or point a <title> that browsers show on hover.
A line needs two points: with fewer, a chart says "not enough data yet" rather than showing
a lonely dot that reads as a stray mark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from markupsafe import Markup, escape

NOT_ENOUGH = "not enough data yet"

# The drawing's own coordinates; CSS scales it to the width available.
_WIDTH = 720.0
_HEIGHT = 160.0


def _fmt(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _hour(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:00 UTC")


def sparkline(values: Sequence[float | None], *, label: str) -> Markup:
    """A small line of the values (gaps where None), scaled to their own range."""
    known = [v for v in values if v is not None]
    if len(known) < 2:
        return Markup(f'<span class="muted sparse" title="{escape(label)}">{NOT_ENOUGH}</span>')
    width, height = 120.0, 28.0
    low, high = min(known), max(known)
    span = (high - low) or 1.0
    step = width / max(len(values) - 1, 1)
    segments: list[list[str]] = [[]]
    for i, value in enumerate(values):
        if value is None:
            if segments[-1]:
                segments.append([])
            continue
        y = height - 2 - (value - low) / span * (height - 4)
        segments[-1].append(f"{_fmt(i * step)},{_fmt(y)}")
    lines = "".join(
        f'<polyline class="spark" points="{" ".join(points)}"/>'
        for points in segments
        if len(points) > 1
    )
    dots = "".join(
        f'<circle class="spark-dot" cx="{points[0].split(",")[0]}" '
        f'cy="{points[0].split(",")[1]}" r="1.5"/>'
        for points in segments
        if len(points) == 1
    )
    return Markup(
        f'<svg class="sparkline" viewBox="0 0 {_fmt(width)} {_fmt(height)}" '
        f'preserveAspectRatio="none" role="img" aria-label="{escape(label)}">'
        f"<title>{escape(label)}</title>{lines}{dots}</svg>"
    )


def bars(
    hours: Sequence[datetime],
    values: Sequence[float],
    *,
    label: str,
    unit: str = "",
    css: str = "bar",
) -> Markup:
    """One bar per hour."""
    top = max(values, default=0) or 1.0
    step = _WIDTH / max(len(values), 1)
    gap = min(1.0, step * 0.15)
    rects = []
    for i, (hour, value) in enumerate(zip(hours, values, strict=True)):
        if not value:
            continue
        h = value / top * (_HEIGHT - 4)
        rects.append(
            f'<rect class="{css}" x="{_fmt(i * step)}" y="{_fmt(_HEIGHT - h)}" '
            f'width="{_fmt(max(step - gap, 0.5))}" height="{_fmt(h)}">'
            f"<title>{_hour(hour)}: {escape(_fmt(value))}{escape(unit)}</title></rect>"
        )
    return _frame(label, "".join(rects))


def lines(
    hours: Sequence[datetime],
    series: Mapping[str, Sequence[float | None]],
    *,
    label: str,
    unit: str = "",
) -> Markup:
    """Several series over the same hours (the first one drawn first), gaps where None."""
    if sum(any(v[i] is not None for v in series.values()) for i in range(len(hours))) < 2:
        return Markup(
            f'<p class="chart chart-sparse" role="img" aria-label="{escape(label)}">'
            f"{NOT_ENOUGH}: a line needs two hours with values</p>"
        )
    known = [v for values in series.values() for v in values if v is not None]
    top = max(known, default=0) or 1.0
    step = _WIDTH / max(len(hours) - 1, 1)
    parts = []
    for index, (name, values) in enumerate(series.items(), start=1):
        points: list[str] = []
        for i, value in enumerate(values):
            if value is None:
                if len(points) > 1:
                    parts.append(
                        f'<polyline class="line line-{index}" points="{" ".join(points)}"/>'
                    )
                points = []
                continue
            x, y = i * step, _HEIGHT - 2 - value / top * (_HEIGHT - 4)
            points.append(f"{_fmt(x)},{_fmt(y)}")
            parts.append(
                f'<circle class="point point-{index}" cx="{_fmt(x)}" cy="{_fmt(y)}" r="1.8">'
                f"<title>{escape(name)} {_hour(hours[i])}: {escape(_fmt(value))}{escape(unit)}"
                "</title></circle>"
            )
        if len(points) > 1:
            parts.append(f'<polyline class="line line-{index}" points="{" ".join(points)}"/>')
    return _frame(label, "".join(parts))


def _frame(label: str, body: str) -> Markup:
    return Markup(
        f'<svg class="chart" viewBox="0 0 {_fmt(_WIDTH)} {_fmt(_HEIGHT)}" '
        f'preserveAspectRatio="none" role="img" aria-label="{escape(label)}">'
        f'<title>{escape(label)}</title><line class="axis" x1="0" y1="{_fmt(_HEIGHT)}" '
        f'x2="{_fmt(_WIDTH)}" y2="{_fmt(_HEIGHT)}"/>{body}</svg>'
    )


def peak(values: Sequence[float | None]) -> float:
    """The top of a chart's scale, for its label."""
    return max((v for v in values if v is not None), default=0.0)
