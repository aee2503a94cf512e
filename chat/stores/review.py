"""Cached answers: remember a completed answer for review, and the admins' decisions on it.

The CachedAnswer row is the record admins review, and it decides what is served: Redis holds a
copy of servable records, but a hit is served only while its record is servable and holds the
same text (`entry_servable`), so a Redis entry left behind by a missed delete is never served.
Each record is linked to the conversations holding its prompt (the one that produced it, and
every one it was served to), so deleting them reaches the cache (chat/stores/erasure.py).
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging

from django.db import DatabaseError, transaction
from django.db.models import F
from django.utils import timezone

from ..infra.audit import audit_record
from ..models import (
    CachedAnswer,
    CachedAnswerSource,
    Conversation,
    Message,
    OutputPolicy,
    PendingEviction,
)
from . import evictions
from .cache import completion_cache

log = logging.getLogger(__name__)


def review_digest(*, text: str, json_value) -> str:
    """sha256 of an answer as the review page shows it: its text and its JSON value, if any.

    The page carries it; an approval or an edit made from a page whose digest is no longer the
    record's is refused, so what gets approved is exactly what the reviewer read.
    """
    shown = json.dumps(
        [text, json_value], sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.sha256(shown.encode()).hexdigest()


def record_digest(record: CachedAnswer) -> str:
    return review_digest(text=record.answer, json_value=record.json_value)


def servable(*, status: str, review_required: bool, sent_back: bool = False) -> bool:
    """The one rule for serving a record: approved, or pending under a policy that needs no
    review and not sent back by users' thumbs-down. Rejected and evicted records are never
    served."""
    if status == CachedAnswer.Status.APPROVED:
        return True
    return status == CachedAnswer.Status.PENDING and not review_required and not sent_back


def _review_required(policy: OutputPolicy | None) -> bool:
    # A record whose policy was deleted is served only if someone approved it.
    return True if policy is None else policy.require_review


def entry_servable(*, key: str, entry: dict) -> bool:
    """Whether a cache hit may be served: its record exists, is servable, and holds the very
    text of the entry. One indexed query on a hit.

    Any other entry (its record deleted, rejected, evicted, awaiting review, or changed since
    the entry was written, and Redis not told yet) is removed now and answered as a miss.
    Without the database nothing is served.
    """
    try:
        row = (
            CachedAnswer.objects.filter(pk=entry.get("record"), key=key)
            .values_list("status", "policy__require_review", "answer", "sent_back_at")
            .first()
        )
        if row is not None:
            status, review_required, text, sent_back_at = row
            # None: the record's policy was deleted, and only an approval serves it then.
            if text == entry.get("text") and servable(
                status=status,
                review_required=review_required is not False,
                sent_back=sent_back_at is not None,
            ):
                return True
        if completion_cache.remove(key):
            PendingEviction.objects.filter(key=key).delete()
    except DatabaseError as exc:
        log.warning("could not check the cached answer %s… (%s); not serving it", key[:12], exc)
    return False


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
    """Put the record in Redis, after the evictions still waiting for it (so a late eviction
    never removes what is published now)."""
    evictions.evictions_retry()
    return completion_cache.put(record.key, cache_entry(record), _ttl(record))


def _conversation_locked(conversation_id: int) -> bool:
    """Lock the conversation's row until the transaction ends; False if it is gone.

    A deletion locks the same rows first (chat/stores/erasure.py), so it either waits for the link
    being written here, and then releases it, or comes first and leaves nothing to link to.
    """
    return bool(
        Conversation.objects.select_for_update().filter(pk=conversation_id).values_list("pk")
    )


def _source_link(record: CachedAnswer, conversation_id: int) -> None:
    CachedAnswerSource.objects.get_or_create(cached_answer=record, conversation_id=conversation_id)


def answer_remember(
    *,
    key: str,
    conversation_id: int,
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
    """Record a normally ended, policy-passing answer of `conversation_id`; publish the record
    if it is servable. Nothing is recorded for a conversation deleted meanwhile.

    The first answer recorded under a key is the one kept: a pending, approved or edited record
    is never overwritten by a later generation of the same key (docs/policies.md, Review), so
    what a reviewer reads is what gets approved. Only an evicted record takes the new answer.
    """
    with transaction.atomic():
        if not _conversation_locked(conversation_id):
            return None  # deleted while its answer was generated: nothing of it is cached
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
        _source_link(record, conversation_id)  # a rejected record holds the prompt too
        if record.status == CachedAnswer.Status.REJECTED:
            return None  # an admin said no: this key stays uncached until they reset it
        if not created and record.redacted_at is not None:
            # A kept approved answer: a new holder's prompt.
            record.prompt, record.rendered_prompt = prompt, rendered_prompt
            record.redacted_at = None
            record.save(update_fields=["prompt", "rendered_prompt", "redacted_at", "updated_at"])
        if not created and record.status == CachedAnswer.Status.EVICTED:
            # Its text was taken out of service on purpose: this answer refills it, to be
            # reviewed afresh. Any other record keeps the text it has.
            record.answer, record.json_value, record.metrics = text, json_value, metrics
            record.finish_reason = finish_reason
            record.status = CachedAnswer.Status.PENDING
            record.reviewed_by = record.edited_by = record.edited_at = None
            record.sent_back_at, record.feedback_since = None, timezone.now()  # a new text
            record.save()
    if servable(
        status=record.status,
        review_required=require_review,
        sent_back=record.sent_back_at is not None,
    ):
        _publish(record)
    return record


def answer_served(
    record_id: int, *, conversation_id: int | None = None, message_id: int | None = None
) -> None:
    """Count one serving; the conversation served it now holds its prompt too, and the message
    names the record it was served from (so its feedback reaches the record)."""
    now = timezone.now()
    with transaction.atomic():
        if conversation_id is not None and _conversation_locked(conversation_id):
            record = CachedAnswer.objects.select_for_update().filter(pk=record_id).first()
            if record is not None:
                _source_link(record, conversation_id)
                if message_id is not None:
                    Message.objects.filter(pk=message_id).update(cached_answer=record)
        CachedAnswer.objects.filter(pk=record_id).update(hits=F("hits") + 1, last_served_at=now)
        CachedAnswer.objects.filter(pk=record_id, first_served_at__isnull=True).update(
            first_served_at=now
        )


class Approval(enum.Enum):
    """How an approval ended."""

    PUBLISHED = "published"  # approved, and in Redis now
    APPROVED = "approved"  # approved; Redis is unreachable, so it is published when next asked
    TEXT_CHANGED = "text changed"  # refused: the record's text is not what the reviewer read
    GONE = "gone"  # refused: the record was deleted meanwhile


def answer_approve(*, record_id: int, seen_digest: str, by) -> Approval:
    """Approve the record if its text is still the one whose digest the reviewer's page carried.

    The compare and the status change happen under the row's lock, so no edit or generation can
    land between them; a generation waiting on the lock then finds the record approved and
    leaves its text alone (`answer_remember`).
    """
    with transaction.atomic():
        record = CachedAnswer.objects.select_for_update().filter(pk=record_id).first()
        if record is None:
            return Approval.GONE
        if record_digest(record) != seen_digest:
            return Approval.TEXT_CHANGED
        before = record.status
        record.status, record.reviewed_by = CachedAnswer.Status.APPROVED, by
        # The reviewer read the feedback so far: only answers served from now on count again.
        record.sent_back_at, record.feedback_since = None, timezone.now()
        record.save(
            update_fields=["status", "reviewed_by", "sent_back_at", "feedback_since", "updated_at"]
        )
        _audited(record, "approve", by, status=[before, record.status])
    return Approval.PUBLISHED if _publish(record) else Approval.APPROVED


def answer_reject(*, record_id: int, by) -> bool:
    """Reject the record: never served, its key kept uncached until reset. True if Redis has
    let its entry go already; otherwise the eviction is retried until it does."""
    return _withdraw(record_id, status=CachedAnswer.Status.REJECTED, by=by, verb="reject")


def answer_evict(*, record_id: int, by=None) -> bool:
    """Take the record's text out of service; the next answer to its key refills it, pending.
    True if Redis has let its entry go already; otherwise the eviction is retried."""
    return _withdraw(record_id, status=CachedAnswer.Status.EVICTED, by=by, verb="evict")


def _audited(record: CachedAnswer, verb: str, by, **changes) -> None:
    """The review action in the audit trail, in the same transaction as its change; named by
    its id and policy, never its prompt (which goes when its conversations are deleted)."""
    audit_record(
        record,
        f"cachedanswer.{verb}",
        changes=changes,
        actor=by,
        object_repr=f"cached answer {record.pk} ({record.policy_slug})",
    )


def _withdraw(record_id: int, *, status, by, verb: str) -> bool:
    """The status change and the eviction recorded in one transaction, so a Redis delete that
    fails now is retried later (chat/stores/evictions.py); the record's status alone already
    stops it being served (`entry_servable`)."""
    with transaction.atomic():
        record = CachedAnswer.objects.select_for_update().filter(pk=record_id).first()
        if record is None:
            return True  # deleted meanwhile: its deletion evicted it
        before, record.status = record.status, status
        fields = ["status", "updated_at"]
        if by is not None and verb == "reject":
            record.reviewed_by = by
            fields.append("reviewed_by")
        record.save(update_fields=fields)
        _audited(record, verb, by, status=[before, status])
        evictions.eviction_schedule(key=record.key)
    # The commit ran the retry (unless an outer transaction is still open).
    return not PendingEviction.objects.filter(key=record.key).exists()


def answer_send_back(record: CachedAnswer) -> None:
    """Users' thumbs-down reached the policy's threshold: the record is pending again and marked
    sent back, so it is not served until an admin approves it, and its Redis entry is evicted
    (retried like a rejection's). Its text is kept for the reviewer, with the comments. Call it
    in a transaction holding the record's row (chat/stores/feedback.py)."""
    before = record.status
    record.status, record.sent_back_at = CachedAnswer.Status.PENDING, timezone.now()
    record.save(update_fields=["status", "sent_back_at", "updated_at"])
    evictions.eviction_schedule(key=record.key)
    _audited(record, "send_back", None, status=[before, record.status])


def answer_reset(*, record_id: int, by=None) -> bool:
    """Let a rejected key be cached again: it becomes evicted, so the next answer refills it
    (pending) instead of bringing back the rejected text. False if it was not rejected."""
    with transaction.atomic():
        updated = CachedAnswer.objects.filter(
            pk=record_id, status=CachedAnswer.Status.REJECTED
        ).update(status=CachedAnswer.Status.EVICTED, updated_at=timezone.now())
        if updated:
            record = CachedAnswer.objects.get(pk=record_id)
            _audited(record, "reset", by, status=[CachedAnswer.Status.REJECTED, record.status])
    return bool(updated)


class Edit(enum.Enum):
    """How an admin's edit ended."""

    SERVED = "served"  # pending under a policy that needs no review: published
    AWAITS_APPROVAL = "awaits approval"  # pending; served once someone approves this text
    REJECTED = "rejected"  # saved on a rejected record, which stays rejected and unserved
    UNCHANGED = "unchanged"  # the same text: nothing was written


class TextChanged(Exception):
    """The record's text is not the one the editor's page showed."""


def answer_edit(*, record_id: int, text: str, seen_digest: str, by) -> Edit:
    """Replace the record's text with an admin's, if the text they edited is still the current one.

    An edit marks the record edited (who, when) and makes it pending again unless it was
    rejected: an approval covers the text it was given, not this one. An evicted record edited
    this way is back in service as pending. Run it inside the admin's transaction: the Redis
    side happens after the commit.
    """
    with transaction.atomic():
        record = CachedAnswer.objects.select_for_update().get(pk=record_id)
        if record_digest(record) != seen_digest:
            raise TextChanged(f"cached answer {record_id} changed since it was shown")
        if record.answer == text:
            return Edit.UNCHANGED
        before = {"answer": record.answer, "status": record.status}
        record.answer, record.edited_by, record.edited_at = text, by, timezone.now()
        # A new text: the feedback on the old one no longer sends it back.
        record.sent_back_at, record.feedback_since = None, record.edited_at
        if record.status != CachedAnswer.Status.REJECTED:
            record.status = CachedAnswer.Status.PENDING
        record.save(
            update_fields=[
                *("answer", "edited_by", "edited_at", "status", "sent_back_at", "feedback_since"),
                "updated_at",
            ]
        )
        changes = {
            name: [value, getattr(record, name)]
            for name, value in before.items()
            if value != getattr(record, name)
        }
        _audited(record, "edit", by, **changes)
        if servable(status=record.status, review_required=_review_required(record.policy)):
            transaction.on_commit(lambda: _publish(record), robust=True)
            return Edit.SERVED
        evictions.eviction_schedule(key=record.key)  # the text it replaced leaves Redis
    return Edit.REJECTED if record.status == CachedAnswer.Status.REJECTED else Edit.AWAITS_APPROVAL
