"""What was spent, day by day, from the `Usage` rows: the usage pages' reports (the user's own,
and the admin's by user, key, policy and day)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from django.db.models import Sum

from ..models import Usage

MAX_DAYS = 366


@dataclass
class DayTotal:
    """One UTC day, shaped as a chart bucket (chat/admin/charts.py draw_chart)."""

    day: date
    tokens: int = 0
    answers: int = 0
    cached_answers: int = 0

    @property
    def end(self) -> datetime:
        return datetime.combine(self.day + timedelta(days=1), time.min, UTC)

    @property
    def mid(self) -> datetime:
        return datetime.combine(self.day, time(12), UTC)

    @property
    def count(self) -> int:
        return self.answers


@dataclass
class UsageReport:
    since: date
    until: date  # today, included
    rows: list[dict]  # day, user, key, policy, tokens, answers, prompt_tokens, cached_answers
    days: list[DayTotal] = field(default_factory=list)

    @property
    def totals(self) -> dict[str, int]:
        keys = ("tokens", "answers", "prompt_tokens", "cached_answers")
        return {key: sum(row[key] for row in self.rows) for key in keys}

    @property
    def is_empty(self) -> bool:
        return not self.rows


def usage_report(
    *,
    days: int = 30,
    user_id: int | None = None,
    username: str = "",
    key_prefix: str = "",
    policy: str = "",
    by_user: bool = True,
    engine: str | None = None,
) -> UsageReport:
    """The last `days` UTC days (today included), newest first, filtered as given (`engine`:
    an engine's name, "" the default engine's); one row per day, policy, engine and (with
    `by_user`) user and key."""
    days = max(1, min(MAX_DAYS, days))
    until = datetime.now(UTC).date()
    since = until - timedelta(days=days - 1)
    rows = Usage.objects.filter(day__gte=since)
    if user_id is not None:
        rows = rows.filter(user_id=user_id)
    if username:
        rows = rows.filter(user__username=username)
    if key_prefix:
        rows = rows.filter(api_key__prefix__startswith=key_prefix)
    if policy:
        rows = rows.filter(policy=policy)
    if engine is not None:
        rows = rows.filter(engine=engine)
    group = ["day", "policy", "engine"] + (["user__username", "api_key__prefix"] if by_user else [])
    grouped = (
        rows.values(*group)
        .annotate(
            tokens_sum=Sum("tokens"),
            answers_sum=Sum("answers"),
            prompt_tokens_sum=Sum("prompt_tokens"),
            cached_answers_sum=Sum("cached_answers"),
        )
        .order_by("-day", *group[1:])
    )
    report_rows = [
        {
            "day": row["day"],
            "user": row.get("user__username", ""),
            "key": row.get("api_key__prefix") or "",
            "policy": row["policy"],
            "engine": row["engine"] or "default",
            "tokens": row["tokens_sum"] or 0,
            "answers": row["answers_sum"] or 0,
            "prompt_tokens": row["prompt_tokens_sum"] or 0,
            "cached_answers": row["cached_answers_sum"] or 0,
        }
        for row in grouped
    ]
    by_day = {since + timedelta(days=n): DayTotal(since + timedelta(days=n)) for n in range(days)}
    for row in report_rows:
        total = by_day[row["day"]]
        total.tokens += row["tokens"]
        total.answers += row["answers"]
        total.cached_answers += row["cached_answers"]
    return UsageReport(since=since, until=until, rows=report_rows, days=list(by_day.values()))
