"""Budgets at a turn's two ends: checked when it is admitted (refused with `quota_exceeded` when
one is spent), charged when its answer has ended.

An answer is charged the tokens the model generated for it (re-asks included; a Continue only
its new part), not its prompt's: the prompt is mostly the conversation so far, sent again every
turn, and largely reused from the prefix KV store. An answer that runs past the budget is
finished and charged in full; the next prompt is refused. A cache hit is charged nothing (it is
recorded as a cached answer): it costs the server a Redis read, not the model. A failed answer
is charged nothing: the failure is the server's.

Visitors have no Budget row: theirs is a setting, tokens per session and per client address in
a sliding window, counted in Redis (chat/stores/visitor_spending.py), checked and charged at the
same two ends and refused with the same `quota_exceeded`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from asgiref.sync import sync_to_async
from django.db import DatabaseError

from ..infra import metrics as prometheus
from ..models.budgets import LIMITS
from ..stores import storage
from ..stores.budgets import Period, Scope, budgets_of, periods, usage_record
from ..stores.spending import spending
from ..stores.visitor_spending import Allowance, address_spending, session_spending
from .refusals import TurnError

log = logging.getLogger(__name__)

QUOTA_EXCEEDED = "quota_exceeded"
_ADJECTIVE = {"day": "daily", "month": "monthly"}


@dataclass(frozen=True)
class Standing:
    """One limit of one budget now: what it allows, what was spent, what is left, until when."""

    scope: Scope
    limit_name: str  # a field of chat.models.budgets.LIMITS: "daily_tokens", ...
    limit: int
    spent: int
    period: Period

    @property
    def left(self) -> int:
        return max(0, self.limit - self.spent)

    @property
    def kind(self) -> str:
        return LIMITS[self.limit_name][1]


def standings(budgets: list[tuple[Scope, dict[str, int]]]) -> list[Standing]:
    """Every limit of `budgets` with what its period has spent (Redis, else the database)."""
    if not budgets:
        return []
    now = periods()
    spent = spending.spent([scope for scope, _ in budgets], list(now.values()))
    return [
        Standing(
            scope,
            name,
            limit,
            spent[(scope, LIMITS[name][0], LIMITS[name][1])],
            now[LIMITS[name][0]],
        )
        for scope, limits in budgets
        for name, limit in limits.items()
    ]


def budget_check(
    user_id: int | None,
    api_key_id: int | None,
    *,
    visitor: str | None = None,
    address: str | None = None,
) -> None:
    """TurnError `quota_exceeded` when a budget of the user's, or of the key's, is spent; for a
    visitor (no user), their session's (`visitor`, the owner's rate key) or address's.

    With the database unavailable the check lets the prompt through: preparing it needs the
    database too, and refuses it with `storage_failed`.
    """
    if user_id is None:
        if visitor is not None:
            visitor_budget_check(visitor, address)
        return
    try:
        now = storage.closing_on_error(lambda: standings(budgets_of(user_id, api_key_id)))
    except DatabaseError as exc:
        log.warning("budgets not checked, the database is unavailable: %s", exc)
        return
    spent_ones = [one for one in now if one.left == 0]
    if not spent_ones:
        return
    left: dict[str, int] = {}
    for one in now:
        left[one.limit_name] = min(left.get(one.limit_name, one.left), one.left)
    # The one that keeps the prompt out longest is the one to name.
    named = max(spent_ones, key=lambda one: one.period.resets_at)
    prometheus.BUDGET_REFUSALS.labels(named.period.span, named.kind).inc()
    raise TurnError(
        QUOTA_EXCEEDED,
        refusal_text(named.scope, named.period),
        left=left,
        resets_at=named.period.resets_at.isoformat().replace("+00:00", "Z"),
    )


def _visitor_keys(visitor: str, address: str | None):
    yield session_spending, visitor
    if address is not None:
        yield address_spending, f"address:{address}"


def visitor_budget_check(visitor: str, address: str | None) -> None:
    """TurnError `quota_exceeded` when the visitor's session, or their address, has spent its
    tokens for the window (CHAT_RATE_LIMITS `visitor_tokens`, `visitor_address_tokens`)."""
    now: list[Allowance] = [
        one
        for counter, key in _visitor_keys(visitor, address)
        if (one := counter.allowance(key)) is not None
    ]
    spent_ones = [one for one in now if one.left == 0]
    if not spent_ones:
        return
    named = max(spent_ones, key=lambda one: one.frees_in)
    frees_at = datetime.now(UTC) + timedelta(seconds=named.frees_in)
    prometheus.BUDGET_REFUSALS.labels("visitor", "tokens").inc()
    whose = "this session's" if named.name == session_spending.name else "this address's"
    raise TurnError(
        QUOTA_EXCEEDED,
        f"{whose} budget for visitors is spent; sign in, or try again after {frees_at:%H:%M} UTC",
        left={one.name: one.left for one in now},
        resets_at=frees_at.isoformat(timespec="seconds").replace("+00:00", "Z"),
    )


def visitor_charge(visitor: str, address: str | None, tokens: int) -> None:
    """A visitor's answer: its tokens added to their session's and their address's windows."""
    for counter, key in _visitor_keys(visitor, address):
        counter.charge(key, tokens)


def refusal_text(scope: Scope, period: Period) -> str:
    """In words, for the page: "your daily budget is spent; it resets at 00:00 UTC"."""
    whose = "your" if scope.kind == "user" else "this API key's"
    when = "at 00:00 UTC" if period.span == "day" else f"on {period.resets_at:%-d %B} at 00:00 UTC"
    return f"{whose} {_ADJECTIVE[period.span]} budget is spent; it resets {when}"


def budget_charge(
    *,
    user_id: int | None,
    api_key_id: int | None,
    policy: str,
    tokens: int,
    prompt_tokens: int = 0,
    cached: bool = False,
    engine: str = "",
) -> dict | None:
    """Record one ended answer: in the database (the record), then in the shared counters.

    Returns the record's fields when the database could not take it (the counters did): the
    caller writes it later, as an answer is (chat/stores/storage.py), so it is not lost.
    """
    if user_id is None:
        return None
    answers = 0 if cached or not tokens else 1
    record = {
        "user_id": user_id,
        "api_key_id": api_key_id,
        "policy": policy,
        "tokens": 0 if cached else tokens,
        "answers": answers,
        "prompt_tokens": prompt_tokens,
        "cached_answers": 1 if cached else 0,
        "day": datetime.now(UTC).date(),
        "engine": engine,
    }
    late = None
    try:
        storage.closing_on_error(usage_record, **record)
    except DatabaseError as exc:
        log.warning("could not record the usage of user %s yet: %s", user_id, exc)
        late = record
    if not cached and answers:
        prometheus.BUDGET_TOKENS.labels(policy).inc(tokens)
        prometheus.BUDGET_ANSWERS.labels(policy).inc()
        scopes = [Scope("user", user_id)] + ([Scope("key", api_key_id)] if api_key_id else [])
        spending.charge(scopes, list(periods().values()), tokens=tokens, answers=answers)
    return late


async def answer_charge(**charge) -> None:
    """`budget_charge` from a turn; a record the database refused is written in the background."""
    late = await sync_to_async(budget_charge)(**charge)
    if late is not None:
        storage.write_late(
            lambda: usage_record(**late), f"the usage of user {late['user_id']} ({late})"
        )
