"""Deleting means deleted: conversations, accounts and retention reach the cache and the review list.

A cached answer is linked to every conversation that holds its prompt (the one that produced it
and each one it was served to: chat/stores/review.py). What a deletion does, whatever the path (the
page's Delete, the admin, an account's deletion, retention, a visitor's ended session):

- the conversation and its messages go (cascade), and its links to cached answers are released
  in the same transaction (`on_delete=SET_NULL`, so the fact survives a crash);
- answers still generating in it are cancelled after the commit; whatever they end with is never
  cached (chat/stores/review.py re-checks the conversation under a lock before recording anything);
- after the commit, every answer's event stream (which holds its whole text, for a page coming
  back) leaves Redis, and a turn still ending writes none again (chat/stores/answer_events.py);
- after the commit, `sources_sweep` erases each cached answer that no live conversation holds:
  its row is deleted and its key evicted from Redis (chat/stores/evictions.py: durable and retried), or,
  if staff approved it as a shared answer, the row is kept and served with its prompt redacted.

Why approved answers are kept: approving says the answer's text is fit for anyone who sends the
same input; the prompt is what belongs to the person, so the prompt goes and the answer stays.
Anything else (pending, rejected, evicted) is removed, rejection included: it only ever applied
to an input that nobody holds any more.

Docs: docs/privacy.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from importlib import import_module

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.db import transaction
from django.db.models import Q, QuerySet
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from .. import turns
from ..infra import audit
from ..models import ApiKey, Budget, CachedAnswer, CachedAnswerSource, Conversation, Message
from ..protocol import CONVERSATION_DELETED
from .answer_events import streams_erase
from .apikeys import apikeys_revoke
from .evictions import evictions_retry, on_commit_once
from .selectors import Owner

log = logging.getLogger(__name__)

REDACTED = "[erased: every conversation that held this prompt was deleted]"
# Conversations deleted per transaction by the purge, so no lock is held for long.
BATCH = 200


# -- conversations ------------------------------------------------------------------


def conversations_erase(*, conversations: QuerySet[Conversation]) -> int:
    """Delete `conversations` and their messages; how many went.

    Their running answers are cancelled after the commit, and the cached answers nobody else
    holds are erased then (`sources_sweep`, through the post_delete signal).
    """
    with transaction.atomic():
        # Locked first, so an answer being cached for one of them waits, then finds it gone. By
        # pk: a caller's queryset may outer-join (select_related), which PostgreSQL cannot lock.
        locked = Conversation.objects.select_for_update().filter(pk__in=conversations.values("pk"))
        ids = list(locked.values_list("pk", flat=True))
        if not ids:
            return 0
        running = list(
            Message.objects.filter(
                conversation_id__in=ids,
                role=Message.Role.ASSISTANT,
                status=Message.Status.STREAMING,
            ).values_list("pk", "conversation__user_id", "conversation__session_key")
        )
        if running:
            transaction.on_commit(partial(_answers_stop, running), robust=True)
        answers = list(
            Message.objects.filter(
                conversation_id__in=ids, role=Message.Role.ASSISTANT
            ).values_list("pk", flat=True)
        )
        transaction.on_commit(partial(_streams_erase, answers), robust=True)
        # Their prefix KV in every process, and their shared generations' events in Redis.
        transaction.on_commit(partial(turns.conversations_forget, ids), robust=True)
        Conversation.objects.filter(pk__in=ids).delete()
    return len(ids)


def _answers_stop(running: list[tuple[int, int | None, str]]) -> None:
    """Cancel answers still generating in deleted conversations, in this process or another."""
    for message_id, user_id, session_key in running:
        turn = turns.running_turns.get(message_id)
        if turn is not None:
            turn.cancel(CONVERSATION_DELETED)  # thread-safe: an Event and the scheduler's lock
            continue
        owner = Owner(user_id=user_id, session_key=session_key)
        try:
            async_to_sync(turns.cancel_bus.publish)(turns.CancelAnswer(message_id, owner.digest))
        except Exception as exc:
            # It then runs to its end for nobody; it is still never stored or cached.
            log.warning("could not cancel answer %s of a deleted conversation: %s", message_id, exc)


def _streams_erase(answers: list[int]) -> None:
    if not streams_erase(answers):
        log.warning("could not erase the event streams of %d answer(s) now", len(answers))


@receiver(post_delete, sender=Conversation, dispatch_uid="chat-erase-released-answers")
def _conversation_deleted(sender, instance: Conversation, using: str, **kwargs) -> None:  # noqa: ARG001 (Django's signature)
    on_commit_once(_sweep_after_commit, using=using)


def _sweep_after_commit() -> None:
    sources_sweep()


# -- cached answers -----------------------------------------------------------------


def sources_sweep() -> int:
    """Erase the cached answers no live conversation holds any more; how many were erased
    (deleted and evicted, or, when approved, kept with the prompt redacted).

    Run after every deletion's commit, and by `manage.py purge` for anything a stopped process
    left: the released links are in the database until this has dealt with them.
    """
    erased = 0
    released = (
        CachedAnswerSource.objects.filter(conversation__isnull=True)
        .order_by()
        .values_list("cached_answer_id", flat=True)
        .distinct()
    )
    for record_id in list(released):
        with transaction.atomic():
            # Locked, so an answer being linked to a new conversation right now is either seen
            # here (and kept) or comes after (and makes a new record).
            record = CachedAnswer.objects.select_for_update().filter(pk=record_id).first()
            if record is None:
                continue
            record.sources.filter(conversation__isnull=True).delete()
            if record.sources.exists():
                continue  # another conversation holds the same prompt
            if record.status == CachedAnswer.Status.APPROVED:
                record.prompt = record.rendered_prompt = REDACTED
                record.redacted_at = timezone.now()
                record.save(
                    update_fields=["prompt", "rendered_prompt", "redacted_at", "updated_at"]
                )
            else:
                audit.audit_answer_forget(record_id=record.pk)  # its records stay, not its text
                record.delete()  # and its key leaves Redis (chat/stores/evictions.py)
            erased += 1
    if erased:
        log.info("erased %d cached answer(s) that no conversation holds any more", erased)
    return erased


# -- accounts -----------------------------------------------------------------------


def account_erase(*, user) -> None:
    """Delete `user` and everything the account holds: API keys (revoked first), conversations
    and messages, the cached answers only they held, their settings, their sessions. The page's "Delete account"
    and the admin's delete both come here. The audit trail keeps its records, redacted."""
    user_id = user.pk
    username, email = user.get_username(), getattr(user, "email", "")
    key_ids = list(ApiKey.objects.filter(user=user).values_list("pk", flat=True))
    budgets = Budget.objects.filter(Q(user=user) | Q(api_key_id__in=key_ids))
    budget_ids = list(budgets.values_list("pk", flat=True))
    # Revoked before the rest, so a key stops working (and its answers stop) even if the
    # deletion below fails.
    apikeys_revoke(ApiKey.objects.filter(user=user))
    with transaction.atomic(), audit.actor_erased(user_id):
        conversations_erase(conversations=Conversation.objects.filter(user=user))
        sessions_end(user_id=user_id)
        user.delete()  # its keys, and anything else that cascades from the user
        # After the delete, so its own record (written by the delete) is redacted too.
        audit.audit_redact(
            user_id=user_id, username=username, email=email, key_ids=key_ids, budget_ids=budget_ids
        )
    log.info("deleted account %s and everything it held", user_id)


def _session_store():
    """The session engine's store class, if its sessions can be listed (the database engines)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    if not hasattr(store, "get_model_class"):
        log.warning(
            "SESSION_ENGINE %s keeps no table to search; sessions are left to expire",
            settings.SESSION_ENGINE,
        )
        return None
    return store


def sessions_end(*, user_id: int) -> int:
    """Delete every session signed in as `user_id`; how many.

    A session row does not say whose it is until decoded, so every row is read: fine for a
    deletion now and then, not for a hot path.
    """
    store = _session_store()
    if store is None:
        return 0
    ended = 0
    for session in store.get_model_class().objects.iterator():
        if store().decode(session.session_data).get(SESSION_KEY) == str(user_id):
            store(session_key=session.session_key).delete()
            ended += 1
    return ended


# -- retention ----------------------------------------------------------------------


def _erase_in_batches(conversations: QuerySet[Conversation]) -> int:
    total = 0
    while True:
        ids = list(conversations.order_by("pk").values_list("pk", flat=True)[:BATCH])
        erased = conversations_erase(conversations=conversations.filter(pk__in=ids)) if ids else 0
        if not erased:
            return total
        total += erased


def conversations_expire(*, days: int) -> int:
    """Delete every conversation with nothing new for `days` days (0: keep all); how many."""
    if days <= 0:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    # updated_at moves when an answer is stored; a prompt just sent in an old conversation
    # counts too, so a turn starting now is not cut from under itself.
    recent = Message.objects.filter(created_at__gte=cutoff).values("conversation_id")
    return _erase_in_batches(
        Conversation.objects.filter(updated_at__lt=cutoff).exclude(pk__in=recent)
    )


def visitors_expire() -> int:
    """Delete the conversations of visitors (no account) whose session has ended; how many.

    Expired sessions are cleared first (what `manage.py clearsessions` does), so a visitor's
    conversations last exactly as long as the cookie that reaches them.
    """
    store = _session_store()
    if store is None:
        return 0
    store.clear_expired()
    live = store.get_model_class().objects.filter(expire_date__gt=timezone.now())
    return _erase_in_batches(
        Conversation.objects.filter(user__isnull=True).exclude(
            session_key__in=live.values("session_key")
        )
    )


@dataclass(frozen=True)
class PurgeReport:
    expired: int  # conversations past the retention period
    visitors: int  # visitors' conversations whose session ended
    answers_before: int
    answers_after: int
    redacted: int  # approved answers kept with their prompt redacted, in all
    evictions_pending: int  # keys Redis could not take yet; retried next time
    audit_expired: int  # audit-trail records past CHAT_AUDIT_RETENTION_DAYS


def retention_purge(*, days: int, audit_days: int = 0) -> PurgeReport:
    """Everything past its time, for cron or a systemd timer: safe to repeat or overlap (each
    batch is its own transaction, and what is already gone is skipped)."""
    answers_before = CachedAnswer.objects.count()
    evictions_retry()
    expired = conversations_expire(days=days)
    visitors = visitors_expire()
    sources_sweep()  # what a process stopped between a deletion and its sweep left behind
    audit_expired = audit.audit_expire(days=audit_days)
    return PurgeReport(
        expired=expired,
        visitors=visitors,
        answers_before=answers_before,
        answers_after=CachedAnswer.objects.count(),
        redacted=CachedAnswer.objects.filter(redacted_at__isnull=False).count(),
        evictions_pending=evictions_retry(),
        audit_expired=audit_expired,
    )
