"""Cached answers: remember a completed answer for review, and the admins' decisions on it.

Redis holds only servable answers; the CachedAnswer row is the record admins review.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from .cache import completion_cache
from .models import CachedAnswer, OutputPolicy

log = logging.getLogger(__name__)


def cache_entry(record: CachedAnswer) -> dict:
    """What Redis holds for a servable answer."""
    return {
        "text": record.answer,
        "json": record.json_value,
        "finish_reason": record.finish_reason,
        "new_tokens": (record.metrics or {}).get("new_tokens", 0),
        "policy": record.policy_slug,
        "policy_version": record.policy_version,
        "record": record.pk,
    }


def _ttl(record: CachedAnswer) -> int:
    return record.policy.cache_ttl_seconds if record.policy else 3600


def _publish(record: CachedAnswer) -> bool:
    return completion_cache.put(record.key, cache_entry(record), _ttl(record))


def answer_remember(
    *,
    key: str,
    prompt: str,
    rendered_prompt: str,
    text: str,
    json_value,
    finish_reason: str,
    metrics: dict,
    policy_id: int | None,
    policy_slug: str,
    policy_version: int,
    model_id: str,
    require_review: bool,
) -> CachedAnswer | None:
    """Record a normally ended, policy-passing answer; publish it unless it awaits review or was rejected."""
    with transaction.atomic():
        record, created = CachedAnswer.objects.select_for_update().get_or_create(
            key=key,
            defaults=dict(
                prompt=prompt,
                rendered_prompt=rendered_prompt,
                answer=text,
                json_value=json_value,
                finish_reason=finish_reason,
                metrics=metrics,
                policy_id=policy_id,
                policy_slug=policy_slug,
                policy_version=policy_version,
                model_id=model_id,
            ),
        )
        if record.status == CachedAnswer.Status.REJECTED:
            return None  # an admin said no: this key stays uncached until they reset it
        if not created:
            if record.answer != text and record.status == CachedAnswer.Status.APPROVED:
                record.status = (
                    CachedAnswer.Status.PENDING
                )  # a different answer needs its own approval
            elif record.status == CachedAnswer.Status.EVICTED:
                record.status = CachedAnswer.Status.PENDING
            record.answer, record.json_value, record.metrics = text, json_value, metrics
            record.finish_reason = finish_reason
            record.save()
    if not require_review or record.status == CachedAnswer.Status.APPROVED:
        _publish(record)
    return record


def answer_served(record_id: int) -> None:
    now = timezone.now()
    CachedAnswer.objects.filter(pk=record_id).update(hits=F("hits") + 1, last_served_at=now)
    CachedAnswer.objects.filter(pk=record_id, first_served_at__isnull=True).update(
        first_served_at=now
    )


def answer_approve(record: CachedAnswer, *, by) -> bool:
    record.status, record.reviewed_by = CachedAnswer.Status.APPROVED, by
    record.save(update_fields=["status", "reviewed_by", "updated_at"])
    return _publish(record)


def answer_reject(record: CachedAnswer, *, by) -> bool:
    record.status, record.reviewed_by = CachedAnswer.Status.REJECTED, by
    record.save(update_fields=["status", "reviewed_by", "updated_at"])
    return completion_cache.evict(record.key)


def answer_evict(record: CachedAnswer) -> bool:
    record.status = CachedAnswer.Status.EVICTED
    record.save(update_fields=["status", "updated_at"])
    return completion_cache.evict(record.key)


def answer_reset(record: CachedAnswer) -> None:
    """Let a rejected key be cached again the next time it is answered."""
    record.status = CachedAnswer.Status.PENDING
    record.save(update_fields=["status", "updated_at"])


def answer_edited(record: CachedAnswer) -> bool:
    """Re-store an edited answer, if it is servable at all."""
    if record.status in (CachedAnswer.Status.REJECTED, CachedAnswer.Status.EVICTED):
        return False
    policy: OutputPolicy | None = record.policy
    if (
        policy is not None
        and policy.require_review
        and record.status != CachedAnswer.Status.APPROVED
    ):
        return False
    return _publish(record)
