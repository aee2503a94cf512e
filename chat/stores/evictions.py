"""Evictions from the completion cache that are never forgotten, even while Redis is down.

Deleting a cached answer's record, by any path (erasure, the admin's delete), and rejecting or
evicting one in review (chat/stores/review.py) writes a PendingEviction row in the same
transaction; after the commit the key is removed from Redis and the row deleted. When Redis
cannot be reached the row stays and is retried at the next moment Redis is known to answer: the
next answer cached or approved, the next erasure or review decision, a hit on that very key, and
every `manage.py purge`. Meanwhile a hit whose record is gone or no longer servable is never
served (`review.entry_servable`).

Why a row in the database rather than a retry in memory: the process may stop before Redis is
back, and the row commits with the deletion itself (both or neither), so nothing can lose it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models import F
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from ..models import CachedAnswer, PendingEviction
from .cache import completion_cache

log = logging.getLogger(__name__)

# Keys removed per Redis call (one DEL with many keys).
BATCH = 500


def on_commit_once(func: Callable[[], object], *, using: str = DEFAULT_DB_ALIAS) -> None:
    """`transaction.on_commit(func)`, once per transaction however many rows ask for it:
    deleting a thousand conversations needs one sweep after the commit, not a thousand."""
    connection = transaction.get_connection(using)
    # Django keeps (savepoint ids, func, robust) per callback; a rolled-back savepoint drops its own.
    if connection.in_atomic_block and any(entry[1] is func for entry in connection.run_on_commit):
        return
    # robust: the deletion has committed; a failing retry must not turn it into an error page.
    transaction.on_commit(func, using=using, robust=True)


def eviction_schedule(*, key: str, using: str = DEFAULT_DB_ALIAS) -> None:
    """Make sure `key` leaves Redis: recorded now, removed once this transaction commits."""
    PendingEviction.objects.using(using).get_or_create(key=key)
    on_commit_once(_retry_after_commit, using=using)


def evictions_retry() -> int:
    """Remove from Redis every pending key it will take now; how many are still pending.

    Stops at the first batch Redis cannot take: it is down, and the rest wait for the next try.
    """
    while True:
        batch = list(PendingEviction.objects.order_by("pk").values_list("pk", "key")[:BATCH])
        if not batch:
            return 0
        pks = [pk for pk, _ in batch]
        if not completion_cache.remove(*(key for _, key in batch)):
            PendingEviction.objects.filter(pk__in=pks).update(
                attempts=F("attempts") + 1, last_attempt_at=timezone.now()
            )
            pending = PendingEviction.objects.count()
            log.warning("%d cache eviction(s) pending until Redis answers again", pending)
            return pending
        PendingEviction.objects.filter(pk__in=pks).delete()


def _retry_after_commit() -> None:
    evictions_retry()


@receiver(post_delete, sender=CachedAnswer, dispatch_uid="chat-evict-deleted-answers")
def _record_deleted(sender, instance: CachedAnswer, using: str, **kwargs) -> None:  # noqa: ARG001 (Django's signature)
    eviction_schedule(key=instance.key, using=using)
