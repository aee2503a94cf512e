"""Cancels that reach a turn wherever it runs: this process's running turns, and one
channel-layer group that every process listens on.

A turn runs in the process that accepted it. A cancel that arrives at another
process is published to the group; each process runs one listener task (started
lazily by chat/turns/, never per consumer) that hands it to a callback, which
stops the turn if it runs there and belongs to the same owner. The chat socket
itself stays off the channel layer, so a Redis outage costs only cross-process
cancels: the listener logs, backs off and reconnects, and local cancels go on.

What crosses the bus names nobody in a way that could be used: an owner travels as its
digest (`Owner.digest`, keyed with SECRET_KEY), never as a session key that anyone reading
the channel layer's Redis could replay as a cookie; an API key as its row id; a deleted
conversation as its opaque tag (chat/turns/forgetting.py); a session as its digest too. Five
notices:

- `CancelAnswer`: stop answer `message_id` if it runs here and is that owner's;
- `CancelKeys`: API keys were revoked: stop every answer they run here;
- `Forget`: conversations were deleted: drop what this process's engine keeps of them;
- `SessionEnded`: a session signed out: close its sockets here (chat/turns/signed_in.py);
- `AccountChanged`: an account was saved or deleted: check its sockets and key answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from channels.layers import get_channel_layer

from ..stores.selectors import Owner

log = logging.getLogger(__name__)

GROUP = "chat.cancel"


@dataclass(frozen=True)
class CancelAnswer:
    """Stop answer `message_id`, if it runs here and its owner's digest is `owner`."""

    message_id: int
    owner: str
    kind = "turn.cancel"

    def fields(self) -> dict[str, Any]:
        return {"message": self.message_id, "owner": self.owner}


@dataclass(frozen=True)
class CancelKeys:
    """API keys `key_ids` were revoked: stop every answer they run here."""

    key_ids: tuple[int, ...]
    kind = "turn.cancel_keys"

    def fields(self) -> dict[str, Any]:
        return {"api_keys": list(self.key_ids)}


@dataclass(frozen=True)
class Forget:
    """Conversations were deleted: drop what this process's engine keeps under their `tags`."""

    tags: tuple[str, ...]
    kind = "conversation.forget"

    def fields(self) -> dict[str, Any]:
        return {"tags": list(self.tags)}


@dataclass(frozen=True)
class SessionEnded:
    """The session whose digest is `session` (of the owner whose digest is `owner`) signed out."""

    owner: str
    session: str
    kind = "session.ended"

    def fields(self) -> dict[str, Any]:
        return {"owner": self.owner, "session": self.session}


@dataclass(frozen=True)
class AccountChanged:
    """The account whose owner digest is `owner` was saved (its password or active flag may
    have changed) or deleted."""

    owner: str
    kind = "account.changed"

    def fields(self) -> dict[str, Any]:
        return {"owner": self.owner}


Notice = CancelAnswer | CancelKeys | Forget | SessionEnded | AccountChanged
Deliver = Callable[[Notice], None]


def notice_parse(message: dict) -> Notice | None:
    """The notice a bus message carries; None for anything else (another version's, malformed)."""
    kind = message.get("type")
    try:
        if kind == CancelAnswer.kind:
            owner = message["owner"]
            if not isinstance(owner, str):
                return None
            return CancelAnswer(int(message["message"]), owner)
        if kind == CancelKeys.kind:
            return CancelKeys(tuple(int(key) for key in message["api_keys"]))
        if kind == Forget.kind:
            tags = tuple(message["tags"])
            return Forget(tags) if all(isinstance(tag, str) for tag in tags) else None
        if kind == SessionEnded.kind:
            owner, session = message["owner"], message["session"]
            if isinstance(owner, str) and isinstance(session, str):
                return SessionEnded(owner, session)
            return None
        if kind == AccountChanged.kind:
            owner = message["owner"]
            return AccountChanged(owner) if isinstance(owner, str) else None
    except (KeyError, TypeError, ValueError):
        return None
    return None


class Cancellable(Protocol):
    message_id: int
    owner: Owner
    api_key_id: int | None  # the API key a /v1 turn was admitted with
    finished: bool
    task: asyncio.Task | None  # the turn's task, awaited when the process drains

    def cancel(self, reason: str = "") -> None:
        """Stop the turn; `reason` goes with its `done` when it is not the user's Stop."""


class CancelBus:
    """Publish notices to every process; listen for them in this one.

    Args:
        deliver: called on the event loop with each notice heard (this process's own too).
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

    async def publish(self, notice: Notice) -> None:
        """Send one notice to every listening process; raises if the channel layer cannot take it."""
        layer = get_channel_layer()
        if layer is None:
            raise RuntimeError("no channel layer is configured")
        message = {"type": notice.kind, **notice.fields()}
        async with asyncio.timeout(self.publish_timeout):  # not wait_for: see stores/partial.py
            await layer.group_send(GROUP, message)

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
        notice = notice_parse(message)
        if notice is None:
            log.info("ignored a message on %s that is no notice of this version", GROUP)
            return
        try:
            self.deliver(notice)
        except Exception:
            log.exception("could not act on %r", notice)
