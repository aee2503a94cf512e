"""Recent answer latency for the admin: p50/p95 of time to first token and total time, per time bucket.

Everything but `fetch_answers` and `latency_report` is pure (no database, no clock), so the maths
can be tested on plain tuples.

Which answers count:
* only assistant messages created in the window (`hours` back from now);
* the percentiles use finished answers (status `done`) only: a cancelled answer's total time is
  however long the user waited before stopping it, and a failed one's is how long it took to fail;
  both are counted in the totals instead;
* answers served from the cache (their metrics carry a `cached_new_tokens` number) answer in a millisecond or
  two and would drag the percentiles down, so they are left out unless `include_cached` is set;
  their share is reported either way;
* a missing, null or non-numeric `ttft_ms` / `total_ms` leaves that answer out of that measure only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from .stats import percentile  # the project's one percentile; also bench's

DEFAULT_HOURS = 24
MIN_HOURS = 1
MAX_HOURS = 720  # 30 days
MAX_ROWS = 20_000  # the newest answers of the window, at most
MAX_BUCKETS = 48
# Bucket widths in minutes; the narrowest that gives at most MAX_BUCKETS buckets is used, which
# gives 24..48 buckets for every whole number of hours in MIN_HOURS..MAX_HOURS.
BUCKET_MINUTES = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440)

CACHED_KEY = "cached_new_tokens"
TRUTHY = {"1", "true", "on", "yes"}


# -- parameters ---------------------------------------------------------------------------------


def parse_hours(raw) -> int:
    """The `hours` query parameter: a whole number, clamped to MIN_HOURS..MAX_HOURS; junk gives the default."""
    try:
        hours = int(str(raw).strip())
    except (TypeError, ValueError):
        return DEFAULT_HOURS
    return max(MIN_HOURS, min(MAX_HOURS, hours))


def parse_flag(raw) -> bool:
    """A checkbox-style query parameter (`1`, `true`, `on`, `yes`); absent or anything else is off."""
    return raw is not None and str(raw).strip().lower() in TRUTHY


# -- maths --------------------------------------------------------------------------------------


def bucket_width(hours: int) -> timedelta:
    """The narrowest width in BUCKET_MINUTES that splits `hours` into at most MAX_BUCKETS buckets."""
    minutes = hours * 60
    for width in BUCKET_MINUTES:
        if math.ceil(minutes / width) <= MAX_BUCKETS:
            return timedelta(minutes=width)
    return timedelta(minutes=math.ceil(minutes / MAX_BUCKETS))


def bucket_bounds(
    since: datetime, until: datetime, width: timedelta
) -> list[tuple[datetime, datetime]]:
    """Consecutive (start, end] spans of `width` ending at `until`; the first is clipped at `since`."""
    count = max(1, math.ceil((until - since) / width))
    bounds = []
    for i in range(count):
        end = until - (count - 1 - i) * width
        bounds.append((max(since, end - width), end))
    return bounds


def bucket_index(at: datetime, until: datetime, width: timedelta, count: int) -> int | None:
    """Which of `count` buckets ending at `until` holds `at`; None when it is past `until` or before the first."""
    if at > until:
        return None
    index = count - 1 - int((until - at) // width)
    if index < 0:
        # `since` itself, when the window is a whole number of buckets, belongs to the first one.
        return 0 if index == -1 and (until - at) == count * width else None
    return index


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


# -- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    start: datetime
    end: datetime
    count: int  # answers in the sample with at least one of the two timings
    ttft_p50: float | None
    ttft_p95: float | None
    total_p50: float | None
    total_p95: float | None

    @property
    def mid(self) -> datetime:
        return self.start + (self.end - self.start) / 2


@dataclass(frozen=True)
class Totals:
    answers: int  # every assistant message of the window that was fetched, whatever its status
    count: int  # the finished answers the percentiles are taken over
    cached: int  # answers served from the cache (counted whether or not they are in the sample)
    cancelled: int
    failed: int
    ttft_p50: float | None
    ttft_p95: float | None
    total_p50: float | None
    total_p95: float | None

    @property
    def cached_share(self) -> float | None:
        return self.cached / self.answers if self.answers else None


@dataclass(frozen=True)
class LatencyReport:
    since: datetime
    until: datetime
    hours: int
    width: timedelta
    include_cached: bool
    buckets: list[Bucket]
    totals: Totals
    truncated: bool = False  # the window held more than MAX_ROWS answers; only the newest were used
    oldest: datetime | None = None  # the oldest answer used

    @property
    def is_empty(self) -> bool:
        return self.totals.count == 0


def summarize(
    rows: Iterable[Sequence],
    *,
    until: datetime,
    hours: int,
    include_cached: bool = False,
    truncated: bool = False,
) -> LatencyReport:
    """The report for rows of (created_at, status, metrics) over the `hours` before `until`."""
    since = until - timedelta(hours=hours)
    width = bucket_width(hours)
    bounds = bucket_bounds(since, until, width)
    per_bucket: list[tuple[list[float], list[float], list[int]]] = [
        ([], [], [0]) for _ in bounds
    ]  # ttft values, total values, sample count
    all_ttft: list[float] = []
    all_total: list[float] = []
    answers = cached = cancelled = failed = count = 0
    oldest = None

    for created_at, status, metrics in rows:
        if created_at < since or created_at > until:
            continue
        answers += 1
        oldest = created_at if oldest is None or created_at < oldest else oldest
        metrics = metrics if isinstance(metrics, dict) else {}
        is_cached = metrics.get(CACHED_KEY) is not None  # null on live answers
        cached += is_cached
        if status == "cancelled":
            cancelled += 1
        elif status == "failed":
            failed += 1
        if status != "done" or (is_cached and not include_cached):
            continue
        ttft, total = _number(metrics.get("ttft_ms")), _number(metrics.get("total_ms"))
        if ttft is None and total is None:
            continue
        index = bucket_index(created_at, until, width, len(bounds))
        if index is None:
            continue
        ttft_values, total_values, counter = per_bucket[index]
        counter[0] += 1
        count += 1
        if ttft is not None:
            ttft_values.append(ttft)
            all_ttft.append(ttft)
        if total is not None:
            total_values.append(total)
            all_total.append(total)

    buckets = [
        Bucket(
            start,
            end,
            counter[0],
            percentile(ttft_values, 50),
            percentile(ttft_values, 95),
            percentile(total_values, 50),
            percentile(total_values, 95),
        )
        for (start, end), (ttft_values, total_values, counter) in zip(
            bounds, per_bucket, strict=True
        )
    ]
    totals = Totals(
        answers=answers,
        count=count,
        cached=cached,
        cancelled=cancelled,
        failed=failed,
        ttft_p50=percentile(all_ttft, 50),
        ttft_p95=percentile(all_ttft, 95),
        total_p50=percentile(all_total, 50),
        total_p95=percentile(all_total, 95),
    )
    return LatencyReport(
        since, until, hours, width, include_cached, buckets, totals, truncated, oldest
    )


# -- the database -------------------------------------------------------------------------------


def fetch_answers(
    since: datetime, until: datetime, limit: int = MAX_ROWS, engine: str = ""
) -> tuple[list[tuple], bool]:
    """(created_at, status, metrics) of the newest `limit` assistant messages in the window (of
    one engine, by the name its answers' metrics carry, when `engine` is given), and whether
    there were more. Only those three columns are read."""
    from ..models import Message

    answers = Message.objects.filter(
        role=Message.Role.ASSISTANT, created_at__gte=since, created_at__lte=until
    )
    if engine:
        answers = answers.filter(metrics__engine=engine)
    rows = list(
        answers.order_by("-created_at", "-id").values_list("created_at", "status", "metrics")[
            : limit + 1
        ]
    )
    return rows[:limit], len(rows) > limit


def latency_report(
    hours: int = DEFAULT_HOURS,
    include_cached: bool = False,
    *,
    now: datetime | None = None,
    limit: int = MAX_ROWS,
    engine: str = "",
) -> LatencyReport:
    from django.utils import timezone

    until = now or timezone.now()
    hours = parse_hours(hours)
    rows, truncated = fetch_answers(until - timedelta(hours=hours), until, limit, engine)
    return summarize(
        rows, until=until, hours=hours, include_cached=include_cached, truncated=truncated
    )
