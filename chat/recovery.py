"""Answers a stopped server left unfinished are marked failed, so history never shows one as forever streaming.

A turn lives in the process that accepted it; if that process dies (crash, restart, kill)
mid-answer, its message stays `streaming`. Every start-up path migrates first
(`make run`, chat/liveserver.py, a deploy), so the sweep runs after `migrate`.
"""

from __future__ import annotations

import logging

from django.utils import timezone

log = logging.getLogger(__name__)

INTERRUPTED = "interrupted: the server stopped before this answer was finished"


def interrupted_answers_close(*, using: str = "default") -> int:
    """Mark every assistant message still `streaming` as failed (interrupted); returns how many."""
    from .models import Message

    count = (
        Message.objects.using(using)
        .filter(role=Message.Role.ASSISTANT, status=Message.Status.STREAMING)
        .update(status=Message.Status.FAILED, error=INTERRUPTED, updated_at=timezone.now())
    )
    if count:
        log.warning("marked %d unfinished answer(s) from a previous run as interrupted", count)
    return count


def on_post_migrate(sender, using="default", **kwargs) -> None:
    interrupted_answers_close(using=using)
