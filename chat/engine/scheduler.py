"""One model, many users: a FIFO queue in front of a single generation worker that batches.

Up to `max_batch` waiting requests that can share a `generate` call (same sampling
settings, none constrained) run together; the rest wait their turn in order.

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

from .types import (
    Failed,
    Finished,
    GenerationRequest,
    Queued,
    QueueFull,
    Sink,
    Started,
    TextChunk,
    Ticket,
    finish_cancelled,
)

log = logging.getLogger(__name__)


class Scheduler:
    """Runs requests in arrival order, batched where they can share a step, on a daemon thread.

    A cancelled waiter leaves the queue at once; a cancelled runner stops after
    at most one more decode step (its batch mates go on), and waiters start as
    soon as the running batch has ended.

    Args:
        backend: anything with `generate_batch(requests, on_texts)` and `batch_signature(request)`.
        max_waiting: further submissions are refused with QueueFull.
        max_batch: requests per generate call; 1 is a plain one-at-a-time queue.
    """

    # How long the worker may hold a batch open for requests announced with `expect`.
    gather_seconds = 0.25

    def __init__(self, backend, *, max_waiting: int = 64, max_batch: int = 1):
        self.backend = backend
        self.max_waiting = max_waiting
        self.max_batch = max(1, max_batch)
        self._incoming = 0  # requests announced but not yet submitted
        self._waiting: deque[Ticket] = deque()
        self._running: list[Ticket] = []
        self._cond = threading.Condition()
        self._numbers = itertools.count(1)
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="generation-worker", daemon=True)
        self._thread.start()

    # -- public ---------------------------------------------------------------

    def expect(self) -> None:
        """Announce a request that is being prepared, so an idle worker waits for it to join the batch.

        Pair every call with `submit(..., expected=True)` or `unexpect()`. A lone user
        pays nothing: the worker only waits while other requests are on their way.
        """
        with self._cond:
            self._incoming += 1

    def unexpect(self) -> None:
        with self._cond:
            self._incoming = max(0, self._incoming - 1)
            self._cond.notify()

    def submit(
        self, request: GenerationRequest, sink: Sink, *, expected: bool = False
    ) -> tuple[Ticket, int]:
        """Queue `request`; returns its ticket and how many requests are ahead of it."""
        with self._cond:
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(
                    f"the server is busy: {len(self._waiting)} answers are waiting; try again shortly"
                )
            if expected:
                self._incoming = max(0, self._incoming - 1)
            ticket = Ticket(request, sink, number=next(self._numbers))
            self._waiting.append(ticket)
            position = len(self._waiting) - 1 + bool(self._running)
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
        finish_cancelled(ticket)
        self._announce(moved)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending, self._waiting = list(self._waiting), deque()
            self._cond.notify_all()
        for ticket in pending:
            self.cancel(ticket)

    # -- worker ---------------------------------------------------------------

    def _announce(self, tickets: list[Ticket]) -> None:
        ahead = 1 if self._running else 0
        for index, ticket in enumerate(tickets):
            ticket.sink(Queued(position=index + ahead))

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                self._gather()
                batch = self._take_batch()
                self._running = batch
                moved = list(self._waiting)
            self._announce(moved)
            self._run(batch)
            with self._cond:
                self._running = []

    def _gather(self) -> None:
        """Hold the batch open briefly while announced requests are still being prepared."""
        if self.max_batch == 1:
            return
        deadline = time.monotonic() + self.gather_seconds
        while self._incoming > 0 and len(self._waiting) < self.max_batch and not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._cond.wait(remaining)

    def _take_batch(self) -> list[Ticket]:
        """The head of the queue plus later waiters that can share its generate call."""
        head = self._waiting.popleft()
        batch = [head]
        signature = self.backend.batch_signature(head.request)
        if signature is None or self.max_batch == 1:
            return batch
        for ticket in list(self._waiting):
            if len(batch) >= self.max_batch:
                break
            if self.backend.batch_signature(ticket.request) == signature:
                self._waiting.remove(ticket)
                batch.append(ticket)
        return batch

    def _run(self, batch: list[Ticket]) -> None:
        now = time.perf_counter()
        live = []
        for ticket in batch:
            if ticket.request.cancel.is_set():  # cancelled between leaving the queue and starting
                finish_cancelled(ticket)
            else:
                ticket.sink(Started(at=now))
                live.append(ticket)
        if not live:
            return
        on_texts = [(lambda sink: lambda text: sink(TextChunk(text)))(t.sink) for t in live]
        try:
            results = self.backend.generate_batch([t.request for t in live], on_texts)
        except Exception as exc:  # the queue must go on whatever one request does
            log.exception(
                "generation failed for %s",
                ", ".join(t.request.label or str(t.number) for t in live),
            )
            for ticket in live:
                ticket.sink(Failed(error=f"{type(exc).__name__}: {exc}", at=time.perf_counter()))
            return
        for ticket, result in zip(live, results, strict=True):
            ticket.sink(Finished(result))
