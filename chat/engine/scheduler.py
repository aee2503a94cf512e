"""One model, many users: a FIFO queue in front of a single generation worker.

Each request's events go to its `sink`, a callable invoked on the worker thread
(or the caller's, for queue moves); it must not block. The async side wraps it
with `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .types import (
    Failed,
    Finished,
    GenerationRequest,
    GenerationResult,
    Queued,
    QueueFull,
    Started,
    TextChunk,
)

log = logging.getLogger(__name__)

Sink = Callable[[object], None]


@dataclass(eq=False)
class Ticket:
    """A request's place in the scheduler; hand it back to `cancel`."""

    request: GenerationRequest
    sink: Sink
    submitted_at: float = field(default_factory=time.perf_counter)
    number: int = 0


class Scheduler:
    """Runs requests one at a time, in arrival order, on a daemon worker thread.

    A cancelled waiter leaves the queue at once; a cancelled runner stops after
    at most one more decode step, and the next waiter starts immediately.

    Args:
        backend: anything with `generate(request, on_text) -> GenerationResult`.
        max_waiting: further submissions are refused with QueueFull.
    """

    def __init__(self, backend, *, max_waiting: int = 64):
        self.backend = backend
        self.max_waiting = max_waiting
        self._waiting: deque[Ticket] = deque()
        self._running: Ticket | None = None
        self._cond = threading.Condition()
        self._numbers = itertools.count(1)
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="generation-worker", daemon=True)
        self._thread.start()

    # -- public ---------------------------------------------------------------

    def submit(self, request: GenerationRequest, sink: Sink) -> tuple[Ticket, int]:
        """Queue `request`; returns its ticket and how many requests are ahead of it."""
        with self._cond:
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(f"the server is busy: {len(self._waiting)} answers are waiting; try again shortly")
            ticket = Ticket(request, sink, number=next(self._numbers))
            self._waiting.append(ticket)
            position = len(self._waiting) - 1 + (self._running is not None)
            self._cond.notify()
        return ticket, position

    def cancel(self, ticket: Ticket) -> None:
        """Stop `ticket` wherever it is; a no-op once it has finished."""
        ticket.request.cancel.set()
        with self._cond:
            try:
                self._waiting.remove(ticket)
            except ValueError:
                return  # running (the stopping criterion sees the flag) or already done
            moved = list(self._waiting)
        now = time.perf_counter()
        ticket.sink(Finished(GenerationResult("", "cancelled", 0, len(ticket.request.input_ids), now, None, now)))
        self._announce(moved)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return int(self._running is not None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending, self._waiting = list(self._waiting), deque()
            self._cond.notify_all()
        for ticket in pending:
            self.cancel(ticket)

    # -- worker ---------------------------------------------------------------

    def _announce(self, tickets: list[Ticket]) -> None:
        ahead = 1 if self._running is not None else 0
        for index, ticket in enumerate(tickets):
            ticket.sink(Queued(position=index + ahead))

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                ticket = self._waiting.popleft()
                self._running = ticket
                moved = list(self._waiting)
            self._announce(moved)
            self._run(ticket)
            with self._cond:
                self._running = None

    def _run(self, ticket: Ticket) -> None:
        sink = ticket.sink
        if ticket.request.cancel.is_set():  # cancelled between leaving the queue and starting
            now = time.perf_counter()
            sink(Finished(GenerationResult("", "cancelled", 0, len(ticket.request.input_ids), now, None, now)))
            return
        sink(Started(at=time.perf_counter()))
        try:
            result = self.backend.generate(ticket.request, lambda text: sink(TextChunk(text)))
        except Exception as exc:  # the queue must go on whatever one request does
            log.exception("generation failed for request %s", ticket.request.label or ticket.number)
            sink(Failed(error=f"{type(exc).__name__}: {exc}", at=time.perf_counter()))
        else:
            sink(Finished(result))
