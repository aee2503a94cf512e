"""Cancels that reach a turn wherever it runs: this process's running turns, and one
channel-layer group that every process listens on.

A turn runs in the process that accepted it. A cancel that arrives at another
process is published to the group; each process runs one listener task (started
lazily by chat/turns/, never per consumer) that hands it to a callback, which
stops the turn if it runs there and belongs to the same owner. The chat socket
itself stays off the channel layer, so a Redis outage costs only cross-process
cancels: the listener logs, backs off and reconnects, and local cancels go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable
from typing import Protocol

from channels.layers import get_channel_layer

from ..stores.selectors import Owner

log = logging.getLogger(__name__)

GROUP = "chat.cancel"
MESSAGE_TYPE = "turn.cancel"

Deliver = Callable[[int, int | None, str], None]


class Cancellable(Protocol):
    message_id: int
    owner: Owner
    finished: bool
    task: asyncio.Task | None  # the turn's task, awaited when the process drains

    def cancel(self, reason: str = "") -> None:
        """Stop the turn; `reason` goes with its `done` when it is not the user's Stop."""


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
        """Every turn still generating here."""
        return [turn for turn in self._turns.values() if not turn.finished]

    def cancel_heard(self, message_id: int, user_id: int | None, session_key: str) -> None:
        """A cancel published by any process: stop the turn if it runs here and is the same owner's."""
        turn = self.get(message_id)
        if turn is not None and turn.owner.is_same(Owner(user_id=user_id, session_key=session_key)):
            log.info("cancel for message %s from another process", message_id)
            turn.cancel()


class CancelBus:
    """Publish cancels to every process; listen for them in this one.

    Args:
        deliver: called on the event loop with (message_id, user_id, session_key) for each cancel heard.
    """

    publish_timeout = 2.0
    min_backoff = 0.5
    max_backoff = 30.0
    # channels_redis drops group members after a day of silence; rejoining often keeps this process in.
    rejoin_seconds = 600.0

    def __init__(self, deliver: Deliver):
        self.deliver = deliver
        self.connected = False
        self._warned = False
        self._task: asyncio.Task | None = None

    async def publish(self, *, message_id: int, user_id: int | None, session_key: str) -> None:
        """Send one cancel to every listening process; raises if the channel layer cannot take it."""
        layer = get_channel_layer()
        if layer is None:
            raise RuntimeError("no channel layer is configured")
        message = {
            "type": MESSAGE_TYPE,
            "message": message_id,
            "user_id": user_id,
            "session_key": session_key,
        }
        await asyncio.wait_for(layer.group_send(GROUP, message), self.publish_timeout)

    def ensure_listening(self) -> None:
        """Start this process's listener on the running loop, unless it already runs there."""
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            return
        # A fresh context: the listener outlives the request or socket that started it.
        self._task = loop.create_task(
            self._listen(), name="chat-cancel-listener", context=contextvars.Context()
        )

    async def stop(self) -> None:
        """Stop listening (tests; a process simply exits)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _listen(self) -> None:
        backoff = self.min_backoff
        while True:
            try:
                await self._listen_once()
                return  # no channel layer configured: nothing to listen to
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.connected:  # it was working: say so once, and retry soon
                    log.warning(
                        "cancel listener lost the channel layer (%s: %s); retrying",
                        type(exc).__name__,
                        exc,
                    )
                    backoff = self.min_backoff
                elif not self._warned:
                    log.warning(
                        "cancel listener cannot reach the channel layer (%s: %s); cancels from other "
                        "processes wait until it answers",
                        type(exc).__name__,
                        exc,
                    )
                self._warned = True
                self.connected = False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff)

    async def _listen_once(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            log.info("no channel layer: cancels reach only turns in the process that receives them")
            return
        channel = await layer.new_channel(prefix="chat-cancel")
        await layer.group_add(GROUP, channel)
        if not self.connected:
            log.info("cancel listener joined %s as %s", GROUP, channel)
        self.connected, self._warned = True, False
        receive = asyncio.ensure_future(layer.receive(channel))
        try:
            while True:
                # Wait without cancelling the pending receive, so no message is lost to a timeout.
                done, _ = await asyncio.wait({receive}, timeout=self.rejoin_seconds)
                if not done:
                    await layer.group_add(GROUP, channel)
                    continue
                message = receive.result()
                receive = asyncio.ensure_future(layer.receive(channel))
                self._hand_over(message)
        finally:
            receive.cancel()

    def _hand_over(self, message: dict) -> None:
        if message.get("type") != MESSAGE_TYPE:
            return
        try:
            self.deliver(
                int(message["message"]), message.get("user_id"), str(message["session_key"])
            )
        except Exception:
            log.exception("could not act on cancel %r", message)
