"""Budgets and usage in the database: whose budgets apply to a turn, what was spent (the durable
record), and the default budget a new account is given.

A period is a UTC day or a UTC month. Spending is counted in Redis for speed and atomicity
(spending.py); the `Usage` rows written here are what those counters are reconciled from.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F, Q, Sum

from ..models import Budget, BudgetDefault, Usage
from ..models.budgets import LIMITS


@dataclass(frozen=True)
class Scope:
    """Whose budget: a user's (`kind` "user") or an API key's ("key")."""

    kind: str
    id: int

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.id}"


@dataclass(frozen=True)
class Period:
    """One UTC day or month: its name in Redis keys, first day, and when it resets."""

    span: str  # "day" or "month"
    name: str
    first_day: date
    resets_at: datetime


def periods(now: datetime | None = None) -> dict[str, Period]:
    """The current UTC day and month."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    today = now.date()
    tomorrow = datetime.combine(today + timedelta(days=1), datetime.min.time(), UTC)
    first = today.replace(day=1)
    next_month = (first + timedelta(days=32)).replace(day=1)
    return {
        "day": Period("day", f"d{today:%Y%m%d}", today, tomorrow),
        "month": Period(
            "month", f"m{today:%Y%m}", first, datetime.combine(next_month, datetime.min.time(), UTC)
        ),
    }


def budgets_of(user_id: int, api_key_id: int | None) -> list[tuple[Scope, dict[str, int]]]:
    """The budgets a turn of this user (through this key) is checked against, with a limit set."""
    rows = Budget.objects.filter(
        Q(user_id=user_id, api_key__isnull=True)
        | (Q(api_key_id=api_key_id) if api_key_id is not None else Q(pk__in=[]))
    )
    found = []
    for row in rows:
        scope = Scope("key", row.api_key_id) if row.api_key_id else Scope("user", row.user_id)
        if limits := row.limits():
            found.append((scope, limits))
    return sorted(found, key=lambda pair: pair[0].kind != "user")


def spent_in_database(scope: Scope, period: Period) -> dict[str, int]:
    """Tokens and answers charged to `scope` in `period`, from the Usage rows."""
    rows = Usage.objects.filter(day__gte=period.first_day)
    rows = (
        rows.filter(user_id=scope.id) if scope.kind == "user" else rows.filter(api_key_id=scope.id)
    )
    sums = rows.aggregate(tokens=Sum("tokens"), answers=Sum("answers"))
    return {"tokens": sums["tokens"] or 0, "answers": sums["answers"] or 0}


def usage_record(
    *,
    user_id: int,
    api_key_id: int | None,
    policy: str,
    tokens: int = 0,
    answers: int = 0,
    prompt_tokens: int = 0,
    cached_answers: int = 0,
    day: date | None = None,
    engine: str = "",
) -> None:
    """Add one answer's spending to its (user, key, policy, engine, day) row, made if it is the
    first (`engine` the answering engine's name; "" the default engine)."""
    day = day or datetime.now(UTC).date()
    match = {
        "user_id": user_id,
        "api_key_id": api_key_id,
        "policy": policy,
        "engine": engine,
        "day": day,
    }
    increments = {
        "tokens": F("tokens") + tokens,
        "answers": F("answers") + answers,
        "prompt_tokens": F("prompt_tokens") + prompt_tokens,
        "cached_answers": F("cached_answers") + cached_answers,
    }
    for _ in range(2):  # two processes making the day's row at once: the loser adds to it
        if Usage.objects.filter(**match).update(**increments):
            return
        try:
            with transaction.atomic():
                Usage.objects.create(
                    **match,
                    tokens=tokens,
                    answers=answers,
                    prompt_tokens=prompt_tokens,
                    cached_answers=cached_answers,
                )
            return
        except IntegrityError:
            continue


def budget_default_apply(
    sender,  # noqa: ARG001 (the signal's signature)
    instance,
    created: bool,
    raw: bool = False,
    **kwargs,
) -> None:
    """post_save of the user model: a new account gets the default budget, when one is set."""
    if not created or raw:
        return
    limits = BudgetDefault.current().limits()
    if limits:
        Budget.objects.create(user=instance, **limits)


def budget_set(*, user_id: int, api_key_id: int | None, limits: dict[str, int | None]) -> Budget:
    """Set (or, with None, remove) some limits of a user's or a key's budget; the others stay."""
    unknown = set(limits) - set(LIMITS)
    if unknown:
        raise ValueError(f"no such limit: {', '.join(sorted(unknown))}")
    # One write either way, so the audit trail has one record of it.
    budget, _ = Budget.objects.update_or_create(
        user_id=user_id, api_key_id=api_key_id, defaults=limits
    )
    return budget
