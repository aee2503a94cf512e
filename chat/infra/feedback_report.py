"""The behaviour page's feedback numbers: per policy and version, the answers users rated up or
down, and the cache hits they stopped or regenerated soon after (chat/stores/feedback.py), of
the answers made in the page's window."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass
class FeedbackCounts:
    up: int = 0
    down: int = 0
    stopped: int = 0
    regenerated: int = 0

    def add(self, kind: str, rating: int | None, count: int) -> None:
        if kind == "rating":
            if rating == 1:
                self.up += count
            elif rating == -1:
                self.down += count
        elif kind in ("stopped", "regenerated"):
            setattr(self, kind, getattr(self, kind) + count)


def feedback_by_version(
    since: datetime, until: datetime
) -> dict[tuple[int | None, int | None], FeedbackCounts]:
    """(policy id, version) -> the feedback on answers made between `since` and `until`."""
    from django.db.models import Count

    from ..models import Feedback

    rows = (
        Feedback.objects.filter(message__created_at__gte=since, message__created_at__lte=until)
        .values_list("message__policy_id", "message__policy_version", "kind", "rating")
        .annotate(n=Count("id"))
        .order_by()
    )
    counts: dict[tuple[int | None, int | None], FeedbackCounts] = {}
    for policy_id, version, kind, rating, n in rows:
        counts.setdefault((policy_id, version), FeedbackCounts()).add(kind, rating, n)
    return counts
