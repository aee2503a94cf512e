"""Answers a stopped server left unfinished are marked interrupted, so history never shows one as
forever streaming; the text saved while they streamed (chat/stores/partial.py) is kept.

A turn lives in the process that accepted it; if that process dies (crash, restart, kill)
mid-answer, its message stays `streaming`. Every start-up path migrates first
(`make run`, harness/liveserver.py, the systemd unit), so the sweep runs after `migrate`.
It closes only the answers of this instance (CHAT_INSTANCE): with several processes on
one database, a process that restarts must not fail the answers the others are generating.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone

from ..protocol.events import Finish

log = logging.getLogger(__name__)

INTERRUPTED = "interrupted: the server stopped before this answer was finished"


def interrupted_answers_close(*, instance: str | None = None, using: str = "default") -> int:
    """Mark this instance's assistant messages still `streaming` as interrupted (their text, saved
    as it grew, is kept, and Continue may finish them); returns how many.

    Rows without an instance predate the field and are closed by any instance.
    """
    from ..models import Message

    instance = settings.CHAT_INSTANCE if instance is None else instance
    count = (
        Message.objects.using(using)
        .filter(
            role=Message.Role.ASSISTANT,
            status=Message.Status.STREAMING,
            instance__in=[instance, ""],
        )
        .update(
            status=Message.Status.INTERRUPTED,
            finish_reason=Finish.INTERRUPTED,
            error=INTERRUPTED,
            updated_at=timezone.now(),
        )
    )
    if count:
        log.warning(
            "marked %d unfinished answer(s) of %s from a previous run as interrupted",
            count,
            instance,
        )
    return count


def on_post_migrate(sender, using="default", **kwargs) -> None:  # noqa: ARG001 (Django's signature)
    interrupted_answers_close(using=using)
