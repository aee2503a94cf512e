"""Identical prompts in flight share one generation (in-flight coalescing).

The completion cache serves a repeated prompt at once, but only after its first answer is
stored; a repeat arriving while that answer is still being generated would start a second,
identical generation. Here a request whose answer identity and token ids match a generation
still running joins it instead: it gets the generation's queue position (or Started and the
text so far as one chunk), then every live event and the same Finished (or Failed). Each
joiner runs its own turn on those events (its own policy gate, stored message and metrics);
only the tokens are shared.

A joiner's cancel detaches it alone (it gets Finished "cancelled" with the text it had and
that text's tokens, which its turn is charged);
the generation is cancelled only when its last listener is gone. Works in front of any
Scheduler (the local ContinuousScheduler or the remote ConcurrentScheduler). Within one
process by itself; with `across` (coalescing_across.py), the one request a process's
identical turns share is in turn shared with the other processes on the same Redis. The
process's one Coalescer is part of its scheduler stack (chat/engine/stack.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Protocol

from ..types import (
    Event,
    Failed,
    Finished,
    GenerationRequest,
    Queued,
    Scheduler,
    Sink,
    Started,
    TextChunk,
    Ticket,
)
from .coalescing_across import CountTokens, cancelled_result


@dataclass(eq=False)
class _Generation:
    """One generation under way and the tickets listening to it, in the order they came."""

    key: tuple[object, ...]
    listeners: list[Ticket] = field(default_factory=list)
    inner: Ticket | None = None  # the ticket of the one request the scheduler runs
    position: int = 0
    started: bool = False
    text: list[str] = field(default_factory=list)
    closed: bool = False  # ended for its listeners: later events are not theirs


class Across(Protocol):
    """How the one request of a generation reaches the scheduler when processes share it."""

    joined: int  # requests that followed another process's generation

    def submit(
        self,
        scheduler: Scheduler,
        key: str,
        request: GenerationRequest,
        sink: Sink,
        expected: bool,
    ) -> tuple[Ticket, int]: ...

    def cancel(self, scheduler: Scheduler, ticket: Ticket) -> None: ...


class Coalescer:
    """The generations in flight in this process, by (scheduler, answer identity, token ids)."""

    def __init__(
        self, across: Across | None = None, count_tokens: CountTokens | None = None
    ) -> None:
        self._lock = threading.RLock()  # a scheduler may call a sink from inside submit/cancel
        self._live: dict[tuple[object, ...], _Generation] = {}
        self._of: dict[Ticket, _Generation] = {}
        self.joined = 0  # requests that joined another's generation (for tests and benchmarks)
        self.across = (
            across  # how the one request reaches the scheduler when processes share a Redis
        )
        self.count_tokens = count_tokens  # a leaving listener's tokens (cancelled_result)

    def sharing(self, scheduler: Scheduler, key: str | None) -> Scheduler:
        """`scheduler` as seen by a turn whose answer has identity `key`: identical requests
        share one generation. A turn with none (sampled without a seed, a context only its
        client holds, a regeneration) gets `scheduler` itself."""
        if key is None:
            return scheduler
        return SharingScheduler(self, scheduler, key)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._live)

    # -- called by SharingScheduler ---------------------------------------------

    def submit(
        self, scheduler: Scheduler, key: str, request: GenerationRequest, sink: Sink, expected: bool
    ) -> tuple[Ticket, int]:
        if request.cancel.is_set():
            # Stopped before it was queued (a Stop just before a re-ask): the scheduler ends it
            # at once, unshared; a shared copy's fresh cancel flag would let it run.
            return scheduler.submit(request, sink, expected=expected)
        ticket = Ticket(request, sink)
        identity = (id(scheduler), key, tuple(request.input_ids))
        with self._lock:
            generation = self._live.get(identity)
            if generation is not None:
                self._join(generation, ticket)
                if expected:
                    scheduler.unexpect()  # announced to the scheduler, but it never runs there
                return ticket, 0 if generation.started else generation.position
            generation = _Generation(identity, [ticket])
            self._live[identity] = generation
            self._of[ticket] = generation
            # Its own cancel flag: a listener's Stop must not stop the others' generation.
            shared = replace(request, cancel=threading.Event())

            def sink(event: Event) -> None:
                self._fan_out(generation, event)

            try:
                if self.across is not None:
                    generation.inner, generation.position = self.across.submit(
                        scheduler, key, shared, sink, expected
                    )
                else:
                    generation.inner, generation.position = scheduler.submit(
                        shared, sink, expected=expected
                    )
            except Exception:
                self._close(generation)
                raise
            return ticket, generation.position

    def cancel(self, scheduler: Scheduler, ticket: Ticket) -> None:
        with self._lock:
            generation = self._of.get(ticket)
            if generation is None:
                return  # finished already
            if len(generation.listeners) > 1:
                generation.listeners.remove(ticket)
                del self._of[ticket]
                result = cancelled_result(
                    generation.text, len(ticket.request.input_ids), self.count_tokens
                )
                ticket.sink(Finished(result))
                return
            # The last listener: the generation itself stops, and its Finished reaches it; nobody
            # may join it any more.
            self._live.pop(generation.key, None)
            inner = generation.inner
        if inner is None:
            return
        if self.across is not None:
            self.across.cancel(scheduler, inner)
        else:
            scheduler.cancel(inner)

    # -- internals --------------------------------------------------------------

    def _join(self, generation: _Generation, ticket: Ticket) -> None:
        """Add a listener and replay what the others have already had (lock held)."""
        generation.listeners.append(ticket)
        self._of[ticket] = generation
        self.joined += 1
        # Still queued, it needs nothing more: its position is what `submit` returns.
        if generation.started:
            ticket.sink(Started(at=time.perf_counter()))
            if generation.text:
                ticket.sink(TextChunk("".join(generation.text)))

    def _fan_out(self, generation: _Generation, event: Event) -> None:
        """Record the event and hand it to every listener, under the lock so a joiner's replay
        and the live events never interleave."""
        with self._lock:
            if generation.closed:
                return  # a shared generation's stray event after its listener left
            if isinstance(event, Queued):
                generation.position = event.position
            elif isinstance(event, Started):
                generation.started = True
            elif isinstance(event, TextChunk):
                generation.text.append(event.text)
            listeners = list(generation.listeners)
            if isinstance(event, (Finished, Failed)):
                self._close(generation)
            for ticket in listeners:
                ticket.sink(event)

    def _close(self, generation: _Generation) -> None:
        generation.closed = True
        if self._live.get(generation.key) is generation:
            del self._live[generation.key]
        for ticket in generation.listeners:
            self._of.pop(ticket, None)


class SharingScheduler:
    """A Scheduler view for one turn: `submit` joins an identical generation in flight."""

    def __init__(self, coalescer: Coalescer, scheduler: Scheduler, key: str):
        self._coalescer, self._scheduler, self._key = coalescer, scheduler, key

    def submit(
        self, request: GenerationRequest, sink: Sink, *, expected: bool = False
    ) -> tuple[Ticket, int]:
        return self._coalescer.submit(self._scheduler, self._key, request, sink, expected)

    def cancel(self, ticket: Ticket) -> None:
        self._coalescer.cancel(self._scheduler, ticket)

    def expect(self) -> None:
        self._scheduler.expect()

    def unexpect(self) -> None:
        self._scheduler.unexpect()

    @property
    def waiting(self) -> int:
        return self._scheduler.waiting

    @property
    def running(self) -> int:
        return self._scheduler.running

    def close(self) -> None:
        self._scheduler.close()
