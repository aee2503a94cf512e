"""Many streams at once to an inference server that batches by itself: N slots, FIFO beyond them.

`Scheduler` runs one `generate_batch` at a time, right for a model in this process.
An inference server (vLLM, TGI) batches continuously, so here every request streams
on its own thread as soon as one of `max_running` slots is free. Same public interface
as `Scheduler` (expect, unexpect, submit, cancel, waiting, running, close) and the same
events to each sink: Queued* -> Started -> TextChunk* -> Finished | Failed.

Queue positions: 0 means the request starts now; a waiter's position is 1 (one of the
running streams must end) plus the waiters ahead of it, as `Scheduler` counts a running batch.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from .scheduler import Sink, Ticket
from .types import EngineError, Failed, Finished, GenerationRequest, GenerationResult, Queued, QueueFull, Started, TextChunk

log = logging.getLogger(__name__)


class ConcurrentScheduler:
    """Streams up to `max_running` requests at once through `backend.generate`, the rest wait in order.

    A cancelled waiter leaves the queue at once (the server never hears of it); a
    cancelled runner's stream is closed by the backend and its slot goes to the next waiter.

    Args:
        backend: anything with `generate(request, on_text)`.
        max_running: streams open at once from this process.
        max_waiting: further submissions are refused with QueueFull.
    """

    def __init__(self, backend, *, max_running: int = 8, max_waiting: int = 64):
        self.backend = backend
        self.max_running = max(1, max_running)
        self.max_waiting = max_waiting
        self._waiting: deque[Ticket] = deque()
        self._running: set[Ticket] = set()
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=self.max_running, thread_name_prefix="remote-stream")

    # -- public ---------------------------------------------------------------

    def expect(self) -> None:
        """Nothing to gather: the server batches whatever arrives."""

    def unexpect(self) -> None:
        """See `expect`."""

    def submit(self, request: GenerationRequest, sink: Sink, *, expected: bool = False) -> tuple[Ticket, int]:
        """Start `request` now if a slot is free, else queue it; returns its ticket and queue position."""
        with self._lock:
            if self._closed:
                raise EngineError("the server is shutting down")
            ticket = Ticket(request, sink, number=next(self._numbers))
            if len(self._running) < self.max_running and not self._waiting:
                self._running.add(ticket)
                position = 0
            else:
                if len(self._waiting) >= self.max_waiting:
                    raise QueueFull(f"the server is busy: {len(self._waiting)} answers are waiting; try again shortly")
                self._waiting.append(ticket)
                position = len(self._waiting)
        if position == 0:
            self._pool.submit(self._run, ticket)
        return ticket, position

    def cancel(self, ticket: Ticket) -> None:
        """Stop `ticket` wherever it is; a no-op once it has finished."""
        ticket.request.cancel.set()  # a running stream's backend closes the connection on this
        with self._lock:
            try:
                self._waiting.remove(ticket)
            except ValueError:
                return
            moved = list(self._waiting)
        _finish_cancelled(ticket)
        _announce(moved)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def close(self) -> None:
        """Cancel every waiter and every open stream (the server sees the connections close)."""
        with self._lock:
            self._closed = True
            pending, self._waiting = list(self._waiting), deque()
            running = list(self._running)
        for ticket in pending:
            ticket.request.cancel.set()
            _finish_cancelled(ticket)
        for ticket in running:
            ticket.request.cancel.set()
        self._pool.shutdown(wait=False)

    # -- worker ---------------------------------------------------------------

    def _run(self, ticket: Ticket) -> None:
        try:
            self._stream(ticket)
        finally:
            with self._lock:
                self._running.discard(ticket)
                promoted = []
                while self._waiting and len(self._running) < self.max_running and not self._closed:
                    nxt = self._waiting.popleft()
                    self._running.add(nxt)
                    promoted.append(nxt)
                moved = list(self._waiting) if promoted else []
            for nxt in promoted:
                self._pool.submit(self._run, nxt)
            _announce(moved)

    def _stream(self, ticket: Ticket) -> None:
        request = ticket.request
        if request.cancel.is_set():  # cancelled between leaving the queue and starting
            _finish_cancelled(ticket)
            return
        ticket.sink(Started(at=time.perf_counter()))
        try:
            result = self.backend.generate(request, lambda text: ticket.sink(TextChunk(text)))
        except Exception as exc:  # the queue must go on whatever one request does
            if isinstance(exc, EngineError):
                log.warning("generation failed for %s: %s", request.label or ticket.number, exc)
            else:
                log.exception("generation failed for %s", request.label or ticket.number)
            ticket.sink(Failed(error=f"{type(exc).__name__}: {exc}", at=time.perf_counter()))
            return
        ticket.sink(Finished(result))


def _finish_cancelled(ticket: Ticket) -> None:
    now = time.perf_counter()
    ticket.sink(Finished(GenerationResult("", "cancelled", 0, len(ticket.request.input_ids), now, None, now)))


def _announce(tickets: list[Ticket]) -> None:
    for index, ticket in enumerate(tickets):
        ticket.sink(Queued(position=index + 1))
