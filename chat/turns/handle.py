"""The turn a transport holds: it may `cancel` it, `detach` from it (its client went away) or
`attach` to it again (a page that reloaded or reconnected: chat/turns/resume.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..engine.types import GenerationRequest
from ..infra import metrics as prometheus
from ..protocol import NO_LISTENER
from ..protocol.events import Event
from ..stores.answer_events import listening_elsewhere
from ..stores.selectors import Owner
from .journal import Journal

log = logging.getLogger(__name__)

# How a transport takes the turn's events: it serializes each for its client.
Send = Callable[[Event], Awaitable[None]]


class Stoppable(Protocol):
    """What a Turn needs of the run behind it (chat/turns/run.py `TurnRun`)."""

    request: GenerationRequest

    def stop(self, reason: str = "") -> None: ...


@dataclass(eq=False)
class Turn:
    """A chat turn as its transports see it.

    Its events go to every listener attached (the socket or HTTP response that started it, and
    any that resumed it), numbered in its journal. When the last listener goes away, generation
    goes on for `grace_s` seconds so a reloading page can attach again; then it stops.
    """

    request_id: str
    conversation_id: int
    message_id: int
    owner: Owner
    send: Send | None  # the first listener: the transport that started the turn
    task: asyncio.Task | None = None
    api_key_id: int | None = None  # a /v1 turn's key: revoking it stops the turn
    address: str | None = None  # a visitor's client address: their budget's second key
    finished: bool = False
    policy: str = ""
    grace_s: float = 0.0
    # The text the answer had before this turn (a Continue's), for a listener that starts afresh.
    text_before: str = ""
    journal: Journal | None = None
    _run: Stoppable | None = field(default=None, repr=False)
    listeners: list[Send] = field(default_factory=list, repr=False)
    _grace: asyncio.TimerHandle | None = field(default=None, repr=False)
    _left_at: float | None = field(default=None, repr=False)  # when the last listener went
    _checking: asyncio.Task | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.send is not None:
            self.listeners.append(self.send)

    def cancel(self, reason: str = "") -> None:
        """Stop generating within one decode step; the partial answer is still stored.

        `reason` goes with the `done` (finish_reason "cancelled") when it is not the user's Stop.
        """
        if self._run is not None:
            self._run.stop(reason)

    @property
    def cancel_requested(self) -> bool:
        return self._run is not None and self._run.request.cancel.is_set()

    def detach(self, send: Send | None = None) -> None:
        """Stop sending to `send` (every listener when None); the answer is still stored when it
        ends. Without a listener left it has `grace_s` to be resumed, then it stops."""
        if send is None:
            self.listeners.clear()
        elif send in self.listeners:
            self.listeners.remove(send)
        self.send = self.listeners[0] if self.listeners else None
        if not self.listeners and not self.finished:
            self._grace_start()

    async def attach(self, send: Send, after: int = 0) -> None:
        """Send `send` the events numbered above `after`, then the live ones."""
        if send in self.listeners:  # the same client again: the replay covers what it missed
            self.listeners.remove(send)
        sent = after
        while self.journal is not None:
            missed = self.journal.since(sent)
            if not missed:
                break
            for event in missed:
                await send(event)
            sent = missed[-1].seq or sent  # type: ignore[attr-defined]
        # Nothing can be emitted between the last check and this line: no event is skipped.
        self.listeners.append(send)
        self.send = self.listeners[0]
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        if self._left_at is not None:  # what a reload costs, for choosing the grace period
            log.info(
                "%s resumed after %.0f ms without a listener",
                self.request_id,
                (time.monotonic() - self._left_at) * 1000,
            )
            self._left_at = None
        prometheus.ANSWERS_RESUMED.labels(self.policy).inc()

    async def emit_last(self, event: Event) -> None:
        """The turn's last event (its `done`, or the error that ends it). The turn has ended for
        its clients from here on, even while its answer is still being counted and cached: a
        prompt sent the moment this arrives is answered, never `busy`."""
        self.finished = True
        await self.emit(event)

    async def emit(self, event: Event) -> None:
        """Number and keep one event, and send it to every listener still there."""
        if self.journal is not None:
            event = self.journal.record(event)
        for send in list(self.listeners):
            try:
                await send(event)
            except Exception:  # the socket went away mid-send: nobody is reading there any more
                log.info("a client of %s went away", self.request_id)
                self.detach(send)

    def _grace_start(self) -> None:
        if self._grace is not None:
            return
        self._left_at = time.monotonic()
        if self.grace_s <= 0:
            self._orphaned()
            return
        self._grace = asyncio.get_running_loop().call_later(self.grace_s, self._orphaned)

    def _orphaned(self) -> None:
        """Nobody came back here within the grace period: unless a client follows it from
        another process (chat/turns/resume.py), stop generating for nobody."""
        self._grace = None
        if not self._unheard():
            return
        self._checking = asyncio.get_running_loop().create_task(self._orphaned_unless_followed())

    def _unheard(self) -> bool:
        return not (self.listeners or self.finished or self.cancel_requested)

    async def _orphaned_unless_followed(self) -> None:
        if await asyncio.to_thread(listening_elsewhere, self.message_id):
            self._grace_start()  # look again after another grace period
            return
        if not self._unheard():
            return
        log.info("nobody listens to %s any more; cancelling", self.request_id)
        prometheus.ANSWERS_ORPHANED.labels(self.policy).inc()
        self.cancel(NO_LISTENER)
