"""An answer's final write: the message and its conversation together, retried, then written late.

A database that is briefly unavailable (locked, restarted, a dropped connection) must not
lose an answer that was already shown: the write is retried for a few seconds, then goes on
in the background; if the process dies first, the start-up sweep (chat/stores/recovery.py) marks
the message interrupted.

Named as every store function is, what and then the act (`apikey_create`, `account_erase`):
`answer_write` is the one transaction, `answer_store` the coroutine that retries it and then
writes late. A name never says sync or async; `async def` does.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from functools import partial

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from ..models import Conversation, Message
from . import review

log = logging.getLogger(__name__)

# Seconds to wait before each attempt at an answer's final write, before the client hears it failed.
STORE_RETRY_DELAYS = (0.0, 0.5, 2.0)
# After that the answer is kept in memory and written in the background (about five minutes in all);
# if the process dies first, the start-up sweep (chat/stores/recovery.py) marks the message interrupted.
LATE_STORE_DELAYS = (5.0, 15.0, 30.0, 60.0, 60.0, 60.0, 60.0)
_late_stores: set[asyncio.Task] = set()  # strong references, so pending writes are not collected


def cached_answer_write(message_id: int, record_id: int | None, **fields) -> None:
    """A cache hit's answer, and one more serving counted on its review record (which now
    counts the answer's conversation among its prompt's holders), together."""
    with transaction.atomic():
        answer_write(message_id, **fields)
        if record_id is not None:
            conversation_id = (
                Message.objects.filter(pk=message_id).values_list("conversation_id", flat=True)
            ).first()
            review.answer_served(record_id, conversation_id=conversation_id, message_id=message_id)


def answer_write(message_id: int, **fields) -> None:
    """The message and its conversation's time, in one transaction: both or neither."""
    with transaction.atomic():
        Message.objects.filter(pk=message_id).update(**fields)
        Conversation.objects.filter(messages__pk=message_id).update(updated_at=timezone.now())


def closing_on_error(fn, *args, **kwargs):
    """Call `fn`; on a database error close this thread's connection, so a locked or broken one is not reused."""
    try:
        return fn(*args, **kwargs)
    except DatabaseError:
        connection.close()
        raise


def _answer_write_closing(message_id: int, **fields) -> None:
    closing_on_error(answer_write, message_id, **fields)


async def answer_store(*, message_id: int, request_id: str, **fields) -> bool:
    """Write an answer's final state, retrying briefly; False if the database stayed unavailable.

    On False the write goes on in the background, so an answer is not lost to a short outage.
    """
    for delay in STORE_RETRY_DELAYS:
        await asyncio.sleep(delay)
        try:
            await sync_to_async(_answer_write_closing)(message_id, **fields)
            return True
        except DatabaseError as exc:
            log.warning("could not store the answer of %s: %s", request_id, exc)
    write_late(
        partial(answer_write, message_id, **fields),
        f"the answer of {request_id}",
        given_up="it stays unfinished until the next start-up",
    )
    return False


def write_late(write: Callable[[], object], what: str, *, given_up: str = "") -> None:
    """Retry `write` in the background over LATE_STORE_DELAYS (about five minutes), so what a
    briefly unavailable database refused is not lost; `what` names it in the log, `given_up`
    says there what follows when every attempt failed."""
    # A fresh context: the attempts outlive the request that failed to store (its
    # thread-sensitive executor is not there for them).
    task = asyncio.create_task(
        _late_write_attempts(write, what, given_up),
        name=f"late: {what}",
        context=contextvars.Context(),
    )
    _late_stores.add(task)
    task.add_done_callback(_late_stores.discard)


async def _late_write_attempts(write: Callable[[], object], what: str, given_up: str) -> None:
    for delay in LATE_STORE_DELAYS:
        await asyncio.sleep(delay)
        try:
            await sync_to_async(closing_on_error)(write)
        except DatabaseError as exc:
            log.warning("still could not store %s: %s", what, exc)
        else:
            log.info("stored %s late, after the database came back", what)
            return
    log.error("gave up storing %s%s", what, f"; {given_up}" if given_up else "")
