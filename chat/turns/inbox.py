"""The engine thread's events handed to a turn's event loop, a batch per wake-up."""

from __future__ import annotations

import asyncio
import threading

from ..engine.types import Event, TextChunk


class EventInbox:
    """Hands the engine thread's events to the event loop: one wake-up for whatever arrived
    since the last (not one per token), with text chunks that arrived together joined, so a
    busy process runs the gate, the journal and the send once for them."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        self._loop, self._queue = loop, queue
        self._lock = threading.Lock()
        self._arrived: list[Event] = []

    def sink(self, event: Event) -> None:  # called on the generation thread; must not block
        with self._lock:
            self._arrived.append(event)
            if len(self._arrived) > 1:
                return  # a wake-up is on its way
        self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            arrived, self._arrived = self._arrived, []
        for event in joined_chunks(arrived):
            self._queue.put_nowait(event)


def joined_chunks(events: list[Event]) -> list[Event]:
    """`events` in order, each run of TextChunks joined into one."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, TextChunk) and isinstance(last, TextChunk):
            out[-1] = TextChunk(last.text + event.text)
        else:
            out.append(event)
    return out
