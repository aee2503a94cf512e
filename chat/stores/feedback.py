"""Users' feedback on answers: a thumbs up or down with an optional comment, and the implicit
signals of a Stop or a Regenerate soon after a cache hit.

A rating counts on a cached answer's review record when the answer was served from it, and when
it is the answer that made it (`on_record`): the first answer of a key becomes the record, pending
review, and its user's thumbs-down and comment are what a reviewer most needs. Once as many distinct
accounts as its policy's `feedback_downs_to_review` rated it down, the record is sent back to
review (chat/stores/review.py, `answer_send_back`): no longer served, evicted from Redis, pending
with the comments. Only signed-in accounts at least `SEND_BACK_ACCOUNT_AGE` old count: a visitor's
session, or an account made minutes ago, costs nothing to make, so three of them could take any
shared answer out of service. Their ratings are stored and shown all the same. Implicit signals
are stored and shown apart, and never send anything back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..infra import metrics
from ..models import CachedAnswer, Feedback, Message, OutputPolicy
from . import review
from .selectors import Owner, answers_for

log = logging.getLogger(__name__)

UP, DOWN = 1, -1
MAX_COMMENT = 2000
# A Stop or Regenerate this soon after a cache hit says the hit was not what the user wanted.
IMPLICIT_WINDOW = timedelta(seconds=10)
# A record whose policy was deleted uses the field's default.
DEFAULT_DOWNS = OutputPolicy._meta.get_field("feedback_downs_to_review").default
# An account younger than this does not count toward a send-back: sign-up is throttled per
# address (5 an hour by default), so without it one address could make the threshold's
# accounts within the hour; with it, the accounts must be made a day ahead, and the audit
# trail has them all by then.
SEND_BACK_ACCOUNT_AGE = timedelta(days=1)


class FeedbackRefused(Exception):
    """The rating cannot be taken: `code` is a wire error code (chat/protocol/errors.py)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class Rated:
    """A rating as stored, and whether it sent its cached answer back to review."""

    message: int
    rating: int
    comment: str
    cached: bool
    sent_back: bool

    def wire(self) -> dict:
        return {
            "message": self.message,
            "rating": self.rating,
            "comment": self.comment,
            "cached": self.cached,
        }


def on_record(record, key) -> Q:
    """Feedback on a record's answer (`record`, `key`: the record and its key, or OuterRefs to
    them): on the messages served from it, and on the answers generated under its key, which
    `Message.identity` names. That is the one that made the record, and any generated while it
    was not served, the same answer (docs/policies.md, a key's first answer is kept)."""
    return Q(message__cached_answer=record) | Q(
        message__cached_answer__isnull=True,
        message__identity=key,
        message__role=Message.Role.ASSISTANT,
        message__status=Message.Status.DONE,
    )


def record_of(message: Message) -> int | None:
    """The review record the message's rating counts on, if any (`on_record`)."""
    if message.cached_answer_id is not None:
        return message.cached_answer_id
    if not message.identity or message.status != Message.Status.DONE:
        return None
    return CachedAnswer.objects.filter(key=message.identity).values_list("pk", flat=True).first()


def _policy_label(policy_slug: str | None) -> str:
    return policy_slug or "none"


def _answer_of(owner: Owner, message_id: int) -> Message:
    """The owner's finished answer `message_id`; 404's code for anyone else's or none."""
    message = answers_for(owner).select_related("policy").filter(pk=message_id).first()
    if message is None:
        raise FeedbackRefused("unknown_request", f"you have no answer {message_id}")
    if message.status == Message.Status.STREAMING:
        raise FeedbackRefused(
            "bad_message", "this answer is still being written; rate it once it ends"
        )
    return message


def rating_set(*, owner: Owner, message_id: int, rating: int, comment: str = "") -> Rated:
    """Set or change the owner's rating of their answer `message_id`; a served cached answer's
    record is sent back to review when this thumbs-down reaches its policy's threshold."""
    if rating not in (UP, DOWN):
        raise FeedbackRefused("bad_feedback", "rating must be 1 (thumbs up) or -1 (thumbs down)")
    with transaction.atomic():
        message = _answer_of(owner, message_id)
        Feedback.objects.update_or_create(
            message=message,
            kind=Feedback.Kind.RATING,
            defaults={"rating": rating, "comment": comment},
        )
        sent_back = rating == DOWN and _send_back_if_due(record_of(message))
    metrics.FEEDBACK.labels(
        _policy_label(message.policy.slug if message.policy else None),
        "up" if rating == UP else "down",
    ).inc()
    return Rated(
        message_id,
        rating,
        comment,
        cached=message.cached_answer_id is not None,
        sent_back=sent_back,
    )


def rating_clear(*, owner: Owner, message_id: int) -> None:
    """Take back the owner's rating of their answer `message_id` (none is fine). A record already
    sent back stays so until reviewed."""
    with transaction.atomic():
        message = _answer_of(owner, message_id)
        Feedback.objects.filter(message=message, kind=Feedback.Kind.RATING).delete()


def downs_counted(record: CachedAnswer) -> int:
    """Distinct accounts that rated the record's answer down (`on_record`), of answers since its
    last approval or new text (`feedback_since`): active accounts at least
    SEND_BACK_ACCOUNT_AGE old, never a visitor's session."""
    downs = Feedback.objects.filter(
        on_record(record, record.key),
        kind=Feedback.Kind.RATING,
        rating=DOWN,
        message__conversation__user__is_active=True,
        message__conversation__user__date_joined__lte=timezone.now() - SEND_BACK_ACCOUNT_AGE,
    )
    if record.feedback_since is not None:
        downs = downs.filter(message__created_at__gte=record.feedback_since)
    return downs.values_list("message__conversation__user_id").distinct().count()


def _send_back_if_due(record_id: int | None) -> bool:
    if record_id is None:
        return False
    record = (
        CachedAnswer.objects.select_for_update(of=("self",))
        .select_related("policy")
        .filter(pk=record_id)
        .first()
    )
    if record is None or record.sent_back_at is not None:
        return False
    if record.status not in (CachedAnswer.Status.PENDING, CachedAnswer.Status.APPROVED):
        return False  # rejected or evicted: not served already
    threshold = record.policy.feedback_downs_to_review if record.policy else DEFAULT_DOWNS
    if not threshold or downs_counted(record) < threshold:
        return False
    review.answer_send_back(record)
    log.info("cached answer %s sent back to review by %s thumbs-down", record.pk, threshold)
    return True


def implicit_signal(*, owner: Owner, message_id: int, kind: Feedback.Kind) -> bool:
    """Note a Stop or Regenerate of the owner's answer `message_id` if it was a cache hit served
    less than IMPLICIT_WINDOW ago; True if it was noted (once per answer and kind)."""
    since = timezone.now() - IMPLICIT_WINDOW
    message = (
        answers_for(owner)
        .filter(pk=message_id, cached_answer__isnull=False, created_at__gte=since)
        .select_related("policy")
        .first()
    )
    if message is None:
        return False
    _, created = Feedback.objects.get_or_create(message=message, kind=kind)
    if created:
        metrics.FEEDBACK.labels(
            _policy_label(message.policy.slug if message.policy else None), str(kind)
        ).inc()
    return created
