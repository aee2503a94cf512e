"""Line charts over time as SVG geometry, drawn on the server for the admin's latency,
behaviour and usage pages (templates/admin/chat/_line_chart.html writes them out).
Geometry only, no styling: the site's Content-Security-Policy refuses inline style, and the
colours come from the admin's CSS variables."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

# Chart geometry, in SVG user units (the SVG scales to the page width).
WIDTH, HEIGHT = 760, 250
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 30, 30
TICK_MINUTES = (5, 10, 15, 30, 60, 120, 180, 240, 360, 720, 1440, 2880, 10080)
MAX_X_TICKS = 8


def nice_ceiling(value: float, ticks: int = 4) -> tuple[float, float]:
    """(top, step): a round step (1, 2, 2.5 or 5 times a power of ten) and the top of the axis,
    a multiple of the step at or above `value`, so that there are at most `ticks` steps."""
    if value <= 0:
        return 1.0, 0.25
    raw = value / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return step * math.ceil(value / step - 1e-9), step


def time_ticks(since: datetime, until: datetime) -> list[tuple[datetime, str]]:
    """Round local times (every N minutes, hours or days) within the window, with labels."""
    span = (until - since).total_seconds() / 60
    step = next((m for m in TICK_MINUTES if span / m <= MAX_X_TICKS - 1), TICK_MINUTES[-1])
    local = timezone.localtime(since)
    if step < 1440:
        minute_of_day = local.hour * 60 + local.minute
        first = local.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(
            minutes=(minute_of_day // step) * step
        )
        fmt = "%H:%M" if span <= 24 * 60 else "%a %H:%M"
    else:
        first = local.replace(hour=0, minute=0, second=0, microsecond=0)
        fmt = "%b %d"
    ticks = []
    tick = first
    while tick <= until:
        if tick >= since:
            ticks.append((tick, timezone.localtime(tick).strftime(fmt)))
        tick += timedelta(minutes=step)
    return ticks


@dataclass
class Series:
    key: str  # "p50" or "p95": the CSS class of its line
    label: str
    segments: list[str] = field(
        default_factory=list
    )  # polyline `points`, one per run of buckets with data
    points: list[dict] = field(
        default_factory=list
    )  # {"x", "y", "title"} for each bucket with data


@dataclass
class Chart:
    id: str
    title: str
    width: int
    height: int
    plot: dict  # left, right, top, bottom edges of the plotting area
    y_ticks: list[dict]
    x_ticks: list[dict]
    series: list[Series]
    legend: list[dict]


def draw_chart(
    *,
    chart_id: str,
    title: str,
    since: datetime,
    until: datetime,
    buckets: list,
    lines: list[tuple[str, str, list[float | None]]],
    y_max: float,
    y_step: float,
    y_label: Callable[[float], str],
    point_label: Callable[[float], str],
    legend: list[dict],
) -> Chart:
    """The SVG geometry of one chart over time: a line per (key, label, value per bucket), over
    buckets with `mid`, `end` and `count`; a bucket without a value breaks its line."""
    left, right, top, bottom = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    span = (until - since).total_seconds() or 1.0

    def x_of(at: datetime) -> float:
        return left + (at - since).total_seconds() / span * (right - left)

    def y_of(value: float) -> float:
        return bottom - value / y_max * (bottom - top)

    series = []
    for key, label, values in lines:
        line = Series(key=key, label=label)
        run: list[str] = []
        for bucket, value in zip(buckets, values, strict=True):
            if value is None:
                if run:
                    line.segments.append(" ".join(run))
                run = []
                continue
            x, y = x_of(bucket.mid), y_of(value)
            run.append(f"{x:.1f},{y:.1f}")
            when = timezone.localtime(bucket.end).strftime("%b %d %H:%M")
            line.points.append(
                {
                    "x": f"{x:.1f}",
                    "y": f"{y:.1f}",
                    "title": f"{label} {point_label(value)} (to {when}, {bucket.count} answers)",
                }
            )
        if run:
            line.segments.append(" ".join(run))
        series.append(line)

    y_ticks = []
    steps = round(y_max / y_step)
    for i in range(steps + 1):
        value = i * y_step
        y_ticks.append({"y": f"{y_of(value):.1f}", "label": y_label(value)})
    x_ticks = [{"x": f"{x_of(at):.1f}", "label": text} for at, text in time_ticks(since, until)]
    return Chart(
        id=chart_id,
        title=title,
        width=WIDTH,
        height=HEIGHT,
        plot={"left": left, "right": right, "top": top, "bottom": bottom},
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        series=series,
        legend=legend,
    )
