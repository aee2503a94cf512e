"""A signed-in user's usage page (/account/usage/): tokens and answers per day for 30 days, by
policy, and what is left of their budgets. The admin's, for everyone, is chat/admin/usage_page.py."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_safe

from ..models import Budget
from ..stores.budgets import Scope
from ..stores.usage import usage_report
from ..turns.budget import standings

USER_DAYS = 30


def budget_rows(user) -> list[dict]:
    """What is left of each of the user's budgets (theirs, then each key's), in words."""
    rows = []
    for budget in Budget.objects.filter(user=user).select_related("api_key"):
        scope = Scope("key", budget.api_key_id) if budget.api_key_id else Scope("user", user.pk)
        whose = f"API key {budget.api_key.prefix}…" if budget.api_key else "you"
        for one in standings([(scope, budget.limits())]):
            resets = one.period.resets_at
            rows.append(
                {
                    "whose": whose,
                    "limit": one.limit_name.replace("_", " "),
                    "allowed": one.limit,
                    "spent": one.spent,
                    "left": one.left,
                    "resets": "00:00 UTC"
                    if one.period.span == "day"
                    else f"{resets:%-d %B}, 00:00 UTC",
                }
            )
    rows.sort(key=lambda row: row["whose"] != "you")
    return rows


@login_required
@require_safe
def usage(request):
    """The signed-in user's usage and budgets."""
    report = usage_report(days=USER_DAYS, user_id=request.user.pk, by_user=False)
    response = render(
        request,
        "chat/usage.html",
        {"report": report, "days": USER_DAYS, "budgets": budget_rows(request.user)},
    )
    response["Cache-Control"] = "no-store"
    return response
