"""The turns running in this process: draining them at shutdown, and cancelling one from any
connection or process (through chat/turns/cancel_bus.py)."""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import sync_to_async

from ..models import Message
from ..protocol import SERVER_RESTARTING
from ..stores.selectors import Owner, answer_status
from .cancel_bus import CancelBus, RunningTurns
from .refusals import TurnError

log = logging.getLogger(__name__)

running_turns = RunningTurns()
cancel_bus = CancelBus(running_turns.cancel_heard)
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
        return "finished"
    turn = running_turns.get(message_id)
    if turn is not None:
        turn.cancel()
        return "cancelled"
    try:
        await cancel_bus.publish(
            message_id=message_id, user_id=owner.user_id, session_key=owner.session_key
        )
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
