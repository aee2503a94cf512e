"""The engine's events handed to a turn's event loop: put at once when they are produced on the
loop's own thread (a stream read on the loop), else a batch per wake-up."""

from __future__ import annotations

import asyncio
import threading

from ..engine.types import Event, TextChunk


class ChunkQueue(asyncio.Queue):
    """A turn's events in order; a text chunk put behind a text chunk not yet taken joins it,
    so a busy process runs the gate, the journal and the send once for them."""

    def _put(self, item: Event) -> None:
        waiting = self._queue  # type: ignore[attr-defined]  # asyncio.Queue's own deque
        if isinstance(item, TextChunk) and waiting and isinstance(waiting[-1], TextChunk):
            waiting[-1] = TextChunk(waiting[-1].text + item.text)
        else:
            waiting.append(item)


class EventInbox:
    """Hands a scheduler's events to the turn's queue on `loop`.

    Called on the loop's thread (a stream read on the loop: chat/engine/remote/loop_stream.py)
    it puts the event straight in: no lock and no wake-up of the loop through its self-pipe.
    Called on another thread (the local engine's, a blocking stream's) it wakes the loop once
    for whatever arrived since the last wake-up, not once per token."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        self._loop, self._queue = loop, queue
        self._loop_thread = threading.get_ident()  # made on the loop, by the turn
        self._lock = threading.Lock()
        self._arrived: list[Event] = []

    def sink(self, event: Event) -> None:  # must not block
        # Behind events from another thread still on their way, it waits its turn with them.
        if threading.get_ident() == self._loop_thread and not self._arrived:
            self._queue.put_nowait(event)
            return
        with self._lock:
            self._arrived.append(event)
            if len(self._arrived) > 1:
                return  # a wake-up is on its way
        self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            arrived, self._arrived = self._arrived, []
        for event in arrived:
            self._queue.put_nowait(event)
