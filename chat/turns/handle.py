"""The turn a transport holds: it may `cancel` it or `detach` from it (the client went away)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..engine.types import GenerationRequest
from ..protocol.events import Event
from ..stores.selectors import Owner

log = logging.getLogger(__name__)

# How a transport takes the turn's events: it serializes each for its client.
Send = Callable[[Event], Awaitable[None]]


class Stoppable(Protocol):
    """What a Turn needs of the run behind it (chat/turns/run.py `TurnRun`)."""

    request: GenerationRequest

    def stop(self, reason: str = "") -> None: ...


@dataclass(eq=False)
class Turn:
    """A chat turn as its transport sees it: it may `cancel` it or `detach` from it (tab closed)."""

    request_id: str
    conversation_id: int
    message_id: int
    owner: Owner
    send: Send | None
    task: asyncio.Task | None = None
    api_key_id: int | None = None  # a /v1 turn's key: revoking it stops the turn
    finished: bool = False
    _run: Stoppable | None = field(default=None, repr=False)

    def cancel(self, reason: str = "") -> None:
        """Stop generating within one decode step; the partial answer is still stored.

        `reason` goes with the `done` (finish_reason "cancelled") when it is not the user's Stop.
        """
        if self._run is not None:
            self._run.stop(reason)

    @property
    def cancel_requested(self) -> bool:
        return self._run is not None and self._run.request.cancel.is_set()

    def detach(self) -> None:
        """Stop sending to the client; the answer is still stored when it ends."""
        self.send = None

    async def emit(self, event: Event) -> None:
        """Send one event to the client, if it is still listening."""
        if self.send is None:
            return
        try:
            await self.send(event)
        except Exception:  # the socket went away mid-send: nobody is reading any more
            log.info("client of %s went away; cancelling", self.request_id)
            self.send = None
            self.cancel()
