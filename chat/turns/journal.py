"""A running answer's events, numbered and kept, so a client that comes back gets what it missed.

Every event a turn emits gets the next `seq` (1 for its `accepted`) and is kept in memory for as
long as the turn runs, and in the answer's Redis stream (chat/stores/answer_events.py) for a
while after. A listener that attaches with the last number it saw gets every later event, then
the live ones, with none lost or sent twice.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

from ..protocol import event_json
from ..protocol.events import Event
from ..stores.answer_events import StreamWriter

# The events after which an answer's stream gets nothing more.
FINAL_TYPES = frozenset({"done", "error"})


class Journal:
    """One turn's numbered events (a Continue starts a new journal on the same message)."""

    def __init__(self, message_id: int, *, resumable: bool = True):
        """`resumable`: kept in the answer's Redis stream too, for a client that comes back
        through another process; an OpenAI-compatible API answer is never resumed, so its
        events are only numbered here."""
        self.message_id = message_id
        self.events: list[Event] = []
        self.stream = StreamWriter(message_id) if resumable else None

    @property
    def last_seq(self) -> int:
        return len(self.events)

    def record(self, event: Event) -> Event:
        """`event` with its number, kept and written to the answer's stream."""
        numbered = replace(cast(Any, event), seq=len(self.events) + 1)
        self.events.append(numbered)
        if self.stream is not None:
            self.stream.push(numbered.seq, event_json(numbered), final=numbered.type in FINAL_TYPES)
        return numbered

    def since(self, after: int) -> list[Event]:
        """The events numbered above `after`, in order."""
        return self.events[max(after, 0) :]
