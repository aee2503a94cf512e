"""An engine's history follows it through a rename.

The usage rows and the answers' metrics (what the usage, latency and behaviour pages split by)
name the engine that answered by the name users saw on the answer. Renaming an engine moves
that history to the new name in one transaction, so its pages do not split in two.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F

from ..models import Message, Usage

COUNTS = ("tokens", "answers", "prompt_tokens", "cached_answers")


def engine_rename(old: str, new: str) -> None:
    """Every usage row and answer recorded under engine `old` now under `new`; a usage row that
    already exists under `new` for the same owner, policy and day takes the counts."""
    if not old or old == new:
        return
    with transaction.atomic():
        for row in Usage.objects.select_for_update().filter(engine=old):
            twin = Usage.objects.filter(
                user_id=row.user_id,
                api_key_id=row.api_key_id,
                policy=row.policy,
                day=row.day,
                engine=new,
            ).first()
            if twin is None:
                row.engine = new
                row.save(update_fields=["engine"])
                continue
            Usage.objects.filter(pk=twin.pk).update(
                **{count: F(count) + getattr(row, count) for count in COUNTS}
            )
            row.delete()
        answers = list(Message.objects.filter(metrics__engine=old).only("pk", "metrics"))
        for answer in answers:
            answer.metrics["engine"] = new
        Message.objects.bulk_update(answers, ["metrics"], batch_size=500)
