"""The turns running in this process: draining them at shutdown, cancelling one from any
connection or process; and what was withdrawn, acted on in every process through
chat/turns/cancel_bus.py: a revoked API key's turns stopped, a deleted conversation's traces in
the engine forgotten, a signed-out session's or a changed account's sockets ended
(chat/turns/signed_in.py)."""

from __future__ import annotations

import asyncio
import hmac
import logging
from functools import partial

from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction

from ..models import Feedback, Message
from ..protocol import API_KEY_REVOKED, SERVER_RESTARTING, SIGNED_OUT
from ..stores import feedback
from ..stores.selectors import Owner, answer_status
from . import signed_in
from .cancel_bus import (
    AccountChanged,
    CancelAnswer,
    CancelBus,
    CancelKeys,
    Cancellable,
    Forget,
    Notice,
    SessionEnded,
)
from .forgetting import conversation_tag, prefix_forget, streams_forget
from .refusals import TurnError

log = logging.getLogger(__name__)


class RunningTurns:
    """The turns generating in this process, by message id: where a cancel from anywhere looks."""

    def __init__(self):
        self._turns: dict[int, Cancellable] = {}

    def add(self, turn: Cancellable) -> None:
        self._turns[turn.message_id] = turn

    def remove(self, message_id: int) -> None:
        self._turns.pop(message_id, None)

    def get(self, message_id: int) -> Cancellable | None:
        """The turn still generating answer `message_id` here, or None."""
        turn = self._turns.get(message_id)
        return turn if turn is not None and not turn.finished else None

    def unfinished(self) -> list[Cancellable]:
        """Every turn still generating here (any thread may ask: the values are copied first)."""
        return [turn for turn in list(self._turns.values()) if not turn.finished]

    def cancel_heard(self, message_id: int, owner: str) -> None:
        """A cancel published by any process: stop the turn if it runs here and is the same owner's."""
        turn = self.get(message_id)
        if turn is not None and hmac.compare_digest(turn.owner.digest, owner):
            log.info("cancel for message %s from another process", message_id)
            turn.cancel()

    def keys_cancel(self, key_ids: tuple[int, ...], reason: str) -> int:
        """Stop every turn running here on one of the API keys `key_ids`; how many."""
        revoked = set(key_ids)
        stopped = [turn for turn in self.unfinished() if turn.api_key_id in revoked]
        for turn in stopped:
            turn.cancel(reason)  # thread-safe: an Event and the scheduler's lock
        if stopped:
            log.info("stopped %d answer(s) of revoked API key(s) %s", len(stopped), sorted(revoked))
        return len(stopped)


running_turns = RunningTurns()


def notice_heard(notice: Notice) -> None:
    """What the bus brought from any process (this one's own too), acted on here."""
    if isinstance(notice, CancelAnswer):
        running_turns.cancel_heard(notice.message_id, notice.owner)
    elif isinstance(notice, CancelKeys):
        running_turns.keys_cancel(notice.key_ids, API_KEY_REVOKED)
    elif isinstance(notice, Forget):
        prefix_forget(notice.tags)
    elif isinstance(notice, SessionEnded):
        signed_in.session_ended(notice.owner, notice.session)
    elif isinstance(notice, AccountChanged):
        signed_in.account_changed(notice.owner, running_turns.unfinished(), SIGNED_OUT)


cancel_bus = CancelBus(notice_heard)
# Prompts accepted and not yet running (being stored, or looked up in the cache).
starting: set[object] = set()


async def turns_drain(seconds: float) -> tuple[int, int]:
    """The process is stopping: let running answers finish for up to `seconds`, then cancel the
    rest and wait until every one is stored. Returns (finished, cancelled).

    Call it after `runtime.draining` is set, so no new turn starts meanwhile.
    """
    loop = asyncio.get_running_loop()
    running = len(running_turns.unfinished()) + len(starting)
    deadline = loop.time() + seconds
    while (running_turns.unfinished() or starting) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    # A turn being stored when time ran out is cancelled once it runs (its store is retried for
    # a few seconds at most; the cap only guards against waiting forever).
    deadline = loop.time() + 30
    while starting and loop.time() < deadline:
        await asyncio.sleep(0.05)
    left = running_turns.unfinished()
    for turn in left:
        turn.cancel(SERVER_RESTARTING)
    tasks = [turn.task for turn in left if turn.task is not None]
    if tasks:
        # Cancelled within one decode step; the store retries a few seconds if the database is slow.
        await asyncio.wait(tasks, timeout=30)
    if left:
        log.warning("drain: cancelled %d unfinished answer(s), stored as cancelled", len(left))
    return running - len(left), len(left)


async def turn_cancel(*, owner: Owner, message_id: int) -> str:
    """Stop the owner's answer `message_id` wherever it runs.

    Returns "cancelled" (it ran here and was stopped), "sent" (it runs in another
    process, which was told), or "finished" (it had already ended: nothing to do).
    Raises TurnError `unknown_request` for an answer that is not the owner's or does
    not exist, and `cancel_unavailable` when another process cannot be reached.
    """
    status = await sync_to_async(answer_status)(owner, message_id)
    if status is None:
        raise TurnError("unknown_request", f"you have no answer {message_id}")
    if status != Message.Status.STREAMING:
        if status == Message.Status.DONE:  # a Stop soon after a cache hit says it missed
            await sync_to_async(feedback.implicit_signal)(
                owner=owner, message_id=message_id, kind=Feedback.Kind.STOPPED
            )
        return "finished"
    turn = running_turns.get(message_id)
    if turn is not None:
        turn.cancel()
        return "cancelled"
    try:
        await cancel_bus.publish(CancelAnswer(message_id, owner.digest))
    except Exception as exc:
        log.warning(
            "could not publish the cancel of message %s: %s: %s",
            message_id,
            type(exc).__name__,
            exc,
        )
        raise TurnError(
            "cancel_unavailable",
            "the answer runs on another server, which cannot be reached right now; try again",
        ) from None
    return "sent"


def api_keys_stop(key_ids: list[int]) -> None:
    """API keys were revoked (sync, after the commit): stop the answers they run here now, and
    in every other process through the bus. Without the bus those run on to their end; the
    keys are refused from the next request on either way."""
    if not key_ids:
        return
    running_turns.keys_cancel(tuple(key_ids), API_KEY_REVOKED)
    try:
        async_to_sync(cancel_bus.publish)(CancelKeys(tuple(key_ids)))
    except Exception as exc:
        log.warning(
            "could not tell other processes to stop the answers of revoked API key(s) %s: %s: %s",
            key_ids,
            type(exc).__name__,
            exc,
        )


def conversations_forget(conversation_ids: list[int]) -> None:
    """Conversations were deleted (sync, after the commit): their prefix KV is dropped here and,
    through the bus, in every other process; their shared generations' events leave Redis.
    Without the bus the other processes keep those entries until they are pushed out (least
    recently used) or the process restarts; logged."""
    tags = tuple(conversation_tag(pk) for pk in conversation_ids)
    if not tags:
        return
    prefix_forget(tags)
    try:
        async_to_sync(cancel_bus.publish)(Forget(tags))
    except Exception as exc:
        log.warning(
            "could not tell other processes to forget %d deleted conversation(s): %s: %s",
            len(tags),
            type(exc).__name__,
            exc,
        )
    streams_forget(tags)


def _publish(notice: Notice, what: str) -> None:
    """Tell every process (sync); without the bus, the next frame's check still refuses."""
    try:
        async_to_sync(cancel_bus.publish)(notice)
    except Exception as exc:
        log.warning("could not tell other processes %s: %s: %s", what, type(exc).__name__, exc)


def on_signed_out(sender, request, user, **kwargs) -> None:  # noqa: ARG001 (Django's signature)
    """Django's user_logged_out (sent before the session is flushed): that session's sockets end."""
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if user is None or not session_key:
        return
    owner = Owner(user_id=user.pk, session_key=session_key)
    _publish(SessionEnded(owner.digest, owner.session_digest), "of a sign-out")


def on_account_saved(
    sender,  # noqa: ARG001 (Django's signature)
    instance,
    created=False,
    update_fields=None,
    **kwargs,
) -> None:
    """post_save and post_delete of the user model: once committed, its sockets and API-key
    answers everywhere are checked again. A save that cannot touch the password or the active
    flag (a sign-in's last_login) is let be."""
    if created or (
        update_fields is not None and not {"password", "is_active"} & set(update_fields)
    ):
        return
    notice = AccountChanged(Owner(user_id=instance.pk, session_key="").digest)
    transaction.on_commit(partial(_publish, notice, "of a changed account"), robust=True)
