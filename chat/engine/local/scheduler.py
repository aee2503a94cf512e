"""One model, many users: a FIFO queue in front of one worker that batches continuously.

The worker drives a running batch (chat/engine/local/decoding.py) one decode step at a time.
Between steps, waiters join it (prefilled together, then decoding with the rest) as long
as the batch has a free row (`max_batch`) and its KV cache stays within `kv_budget_bytes`;
rows that end leave at once. Nobody waits for someone else's answer to finish unless
the batch is full, and then only for the first row to end.

Each request's events go to its `sink`, a callable invoked on the worker thread
(or the caller's, for queue moves); it must not block. The async side wraps it
with `loop.call_soon_threadsafe`. The text a step makes is handed on once the step is over,
not token by token while it picks them: a sink woken mid-step wakes the event loop, whose
Python then holds the GIL the worker needs to pick the next row's token.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from typing import Any

from ..types import (
    Batch,
    Failed,
    Finished,
    GenerationRequest,
    Queued,
    QueueFull,
    Reading,
    Scheduler,
    Sink,
    Started,
    SteppedBackend,
    TextChunk,
    Ticket,
    finish_cancelled,
)

log = logging.getLogger(__name__)


class ContinuousScheduler(Scheduler):
    """Runs requests in arrival order, joined into one running batch, on a daemon thread.

    A cancelled waiter leaves the queue at once; a cancelled runner is dropped from the
    batch before the next decode step (its batch mates go on) and its row goes to the
    next waiter.

    Queue positions: 0 means the request starts at the next step; a waiter that must
    wait for a row to end is at 1 plus the waiters ahead of it that must wait too (as
    ConcurrentScheduler counts).

    Args:
        backend: a SteppedBackend (types.py): LocalBackend.
        max_waiting: further submissions are refused with QueueFull.
        max_batch: rows decoding at once; 1 is a plain one-at-a-time queue.
        kv_budget_bytes: KV cache the batch may reserve (rows x longest possible row, padding
            included); a lone request is always admitted. None: no limit.
    """

    # How long an idle worker may hold the first step for requests announced with `expect`.
    gather_seconds = 0.25

    def __init__(
        self,
        backend: SteppedBackend[Any],
        *,
        max_waiting: int = 64,
        max_batch: int = 1,
        kv_budget_bytes: int | None = None,
    ):
        self.backend = backend
        self.max_waiting = max_waiting
        self.max_batch = max(1, max_batch)
        self.kv_budget_bytes = kv_budget_bytes
        self._incoming = 0  # requests announced but not yet submitted
        self._waiting: deque[Ticket] = deque()
        self._running: list[Ticket] = []
        self._positions: dict[Ticket, int] = {}  # last position each waiter was told
        self._cond = threading.Condition()
        self._numbers = itertools.count(1)
        self._closed = False
        # Text chunks made during a batch call, handed on after it (`_deliver`); worker only.
        self._outbox: list[tuple[Sink, TextChunk]] = []
        self._thread = threading.Thread(target=self._work, name="generation-worker", daemon=True)
        self._thread.start()

    # -- public ---------------------------------------------------------------

    def expect(self) -> None:
        """Announce a request that is being prepared, so an idle worker waits for it to join the first step.

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
        """Queue `request`; returns its ticket and its queue position (0: it starts at the next step)."""
        with self._cond:
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(
                    f"the server is busy: {len(self._waiting)} answers are waiting; try again shortly"
                )
            if expected:
                self._incoming = max(0, self._incoming - 1)
            ticket = Ticket(request, sink, number=next(self._numbers))
            self._waiting.append(ticket)
            position = self._queue_positions()[-1]
            self._positions[ticket] = position
            self._cond.notify()
        return ticket, position

    def cancel(self, ticket: Ticket) -> None:
        """Stop `ticket` wherever it is; a no-op once it has finished."""
        ticket.request.cancel.set()
        with self._cond:
            try:
                self._waiting.remove(ticket)
            except ValueError:
                return  # running (dropped before the next step) or already done
            self._positions.pop(ticket, None)
            moved = self._moves()
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
            for ticket in self._running:
                ticket.request.cancel.set()
            self._cond.notify_all()
        for ticket in pending:
            ticket.request.cancel.set()
            finish_cancelled(ticket)

    # -- queue positions --------------------------------------------------------

    def _queue_positions(self) -> list[int]:
        """Each waiter's position: 0 for those the next step admits, then 1, 2, ... (lock held)."""
        running, positions, blocked = list(self._running), [], 0
        for ticket in self._waiting:
            if not blocked and len(running) < self.max_batch and self._fits(ticket, running):
                running.append(ticket)
                positions.append(0)
            else:
                blocked += 1
                positions.append(blocked)
        return positions

    def _moves(self) -> list[tuple[Ticket, int]]:
        """Waiters whose position changed since they were last told (call with the lock held)."""
        moved = []
        for ticket, position in zip(self._waiting, self._queue_positions(), strict=True):
            if self._positions.get(ticket) != position:
                self._positions[ticket] = position
                moved.append((ticket, position))
        return moved

    @staticmethod
    def _announce(moved: list[tuple[Ticket, int]]) -> None:
        for ticket, position in moved:
            ticket.sink(Queued(position=position))

    # -- worker ---------------------------------------------------------------

    def _work(self) -> None:
        batch = self._new_batch()
        tickets: dict[int, tuple[Ticket, float]] = {}  # id(row) -> its ticket and start time
        while True:
            with self._cond:
                while not self._waiting and not len(batch) and not self._closed:
                    self._cond.wait()
                if self._closed and not len(batch):
                    return
                if not len(batch):
                    self._gather()
                joining = self._admit()
                moved = self._moves()
            self._announce(moved)
            try:
                self._finish(self._join(batch, joining, tickets), tickets)
                self._finish(batch.drop_cancelled(), tickets)
                self._finish(batch.step(), tickets)
            except Exception as exc:  # the queue must go on whatever one step does
                self._fail(list(tickets.values()), exc)
                tickets.clear()
                batch = self._new_batch()

    def _new_batch(self) -> Batch[Any]:
        batch = self.backend.new_batch()
        # A long prompt's chunk pauses between layers when a waiter could join: nobody waits
        # for the rest of a document's forward pass (decoding.py).
        batch.pause_when = self._someone_can_join
        return batch

    def _someone_can_join(self) -> bool:
        with self._cond:
            return bool(self._waiting) and self._queue_positions()[0] == 0

    def _gather(self) -> None:
        """Hold the first step briefly while announced requests are still being prepared."""
        if self.max_batch == 1:
            return
        deadline = time.monotonic() + self.gather_seconds
        while self._incoming > 0 and len(self._waiting) < self.max_batch and not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._cond.wait(remaining)

    def _admit(self) -> list[Ticket]:
        """Waiters that fit into the batch now, in order (call with the lock held)."""
        joining = []
        while self._waiting and len(self._running) < self.max_batch:
            if not self._fits(self._waiting[0], self._running):
                break  # first come, first served: nobody overtakes the head of the queue
            ticket = self._waiting.popleft()
            self._positions.pop(ticket, None)
            self._running.append(ticket)
            joining.append(ticket)
        return joining

    def _fits(self, ticket: Ticket, running: list[Ticket]) -> bool:
        """Whether the batch's KV cache, padded to its longest possible row, stays within budget.

        A request alone always fits: it could never run otherwise.
        """
        if self.kv_budget_bytes is None or not running:
            return True
        rows = [*running, ticket]
        longest = max(self._reserve(t) for t in rows)
        return len(rows) * longest * self.backend.kv_bytes_per_token() <= self.kv_budget_bytes

    def _reserve(self, ticket: Ticket) -> int:
        request = ticket.request
        cap = self.backend.config.max_new_tokens_cap
        return len(request.input_ids) + max(1, min(request.params.max_new_tokens, cap))

    def _join(self, batch, joining: list[Ticket], tickets: dict) -> list:
        """Start the admitted tickets: prefill them together and add them to the batch."""
        rows = []
        now = time.perf_counter()
        for ticket in joining:
            if ticket.request.cancel.is_set():  # cancelled between leaving the queue and starting
                self._release(ticket)
                finish_cancelled(ticket)
                continue
            try:
                row = self.backend.row(
                    ticket.request,
                    lambda text, s=ticket.sink: self._outbox.append((s, TextChunk(text))),
                )
            except Exception as exc:  # e.g. PromptTooLong: this request alone fails
                self._fail([(ticket, now)], exc)
                continue
            row.on_reading = lambda done, total, s=ticket.sink: s(Reading(done, total))
            ticket.sink(Started(at=now))
            tickets[id(row)] = (ticket, now)
            rows.append(row)
        return batch.add(rows)

    def _deliver(self) -> None:
        """Hand on the text the last batch call made, in the order it was made."""
        outbox, self._outbox = self._outbox, []
        for sink, chunk in outbox:
            sink(chunk)

    def _finish(self, rows: list, tickets: dict) -> None:
        self._deliver()  # every row's text before any row's end
        finished = time.perf_counter()
        for row in rows:
            ticket, started = tickets.pop(id(row))
            self._release(ticket)
            ticket.sink(Finished(self.backend.result(row, started, finished)))

    def _fail(self, failed: list[tuple[Ticket, float]], exc: Exception) -> None:
        self._deliver()
        log.error(
            "generation failed for %s",
            ", ".join(t.request.label or str(t.number) for t, _ in failed),
            exc_info=exc,
        )
        for ticket, _ in failed:
            self._release(ticket)
            ticket.sink(
                Failed(
                    error=f"{type(exc).__name__}: {exc}",
                    at=time.perf_counter(),
                    code=getattr(exc, "code", "model_error"),
                )
            )

    def _release(self, ticket: Ticket) -> None:
        with self._cond:
            if ticket in self._running:
                self._running.remove(ticket)
