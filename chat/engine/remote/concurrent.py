"""Many streams at once to an inference server that batches by itself: N slots, FIFO beyond them.

`scheduler.ContinuousScheduler` steps a model in this process itself. An inference server
(vLLM, TGI) batches continuously on its own, so here every request streams by itself (a task
on the event loop, or a thread: below) as soon as one of `max_running` slots is free. Both implement the Scheduler Protocol in
types.py and send the same events to each sink: Queued* -> Started -> TextChunk* -> Finished | Failed.

Queue positions: 0 means the request starts now; a waiter's position is 1 (one of the
running streams must end) plus the waiters ahead of it, as the local scheduler counts them.

A request submitted from a running event loop, to a backend with `agenerate` (the remote
one), streams as a task on that loop: no thread per stream and no hand-off per token, its
sink called on the loop's thread. Any other (the local engine's tests, commands without a
loop) streams on one of the pool's threads through the blocking `generate`. Either way the
slots, the queue and the events are the same.

With an `admission` (chat/engine/remote/global_queue.py) the slots and the queue are global, shared
through Redis by every process using the same server; positions are then ranks in the
global queue. If Redis cannot be reached the scheduler says so in the log and admits up
to its own `max_running`, and goes back to the global queue once Redis answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..types import (
    Backend,
    EngineError,
    Failed,
    Finished,
    GenerationRequest,
    Queued,
    QueueFull,
    Scheduler,
    Sink,
    Started,
    TextChunk,
    Ticket,
    finish_cancelled,
)

if TYPE_CHECKING:
    from .global_queue import RedisAdmission

log = logging.getLogger(__name__)


@dataclass(eq=False)
class RemoteTicket(Ticket):
    """A ticket with its place in the global queue, when there is one."""

    admission_id: str | None = None
    position: int = 0
    loop: asyncio.AbstractEventLoop | None = None  # streams there, as a task, when set
    task: asyncio.Task[None] | None = None
    # Its task has begun: a task cancelled before its first step would skip its own `finally`
    # (the slot never given back, no Finished); one not yet begun reads the cancel flag instead.
    begun: bool = False


class ConcurrentScheduler(Scheduler):
    """Streams up to `max_running` requests at once through `backend.generate`, the rest wait in order.

    A cancelled waiter leaves the queue at once (the server never hears of it); a
    cancelled runner's stream is closed by the backend and its slot goes to the next waiter.

    Args:
        backend: anything with `generate(request, on_text)`; with `agenerate` too, requests
            submitted on an event loop stream there.
        max_running: streams open at once from this process.
        max_waiting: further submissions are refused with QueueFull.
        admission: a shared queue (RedisAdmission) whose slots every process must hold; None for per-process only.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        max_running: int = 8,
        max_waiting: int = 64,
        admission: RedisAdmission | None = None,
    ):
        self.backend = backend
        self.max_running = max(1, max_running)
        self.max_waiting = max_waiting
        self._waiting: deque[RemoteTicket] = deque()
        self._running: set[RemoteTicket] = set()
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._closed = False
        self._pool = ThreadPoolExecutor(
            max_workers=self.max_running, thread_name_prefix="remote-stream"
        )
        # The asyncio twin of `generate`, when the backend has one (the remote backend does).
        self._agenerate = getattr(backend, "agenerate", None)
        self._admission = admission
        self._global = admission is not None  # False while Redis is unreachable
        self._down = admission.errors if admission is not None else ()
        if admission is not None:
            threading.Thread(target=self._coordinate, name="remote-admission", daemon=True).start()

    # -- public ---------------------------------------------------------------

    def expect(self) -> None:
        """Nothing to gather: the server batches whatever arrives."""

    def unexpect(self) -> None:
        """See `expect`."""

    def submit(
        self, request: GenerationRequest, sink: Sink, *, expected: bool = False
    ) -> tuple[Ticket, int]:
        """Start `request` now if a slot is free, else queue it; returns its ticket and queue position."""
        with self._lock:
            if self._closed:
                raise EngineError("the server is shutting down")
            ticket = RemoteTicket(request, sink, number=next(self._numbers), loop=_loop_here())
            position = self._place_global(ticket) if self._global else self._place_local(ticket)
            if position == 0:
                self._running.add(ticket)
            else:
                self._waiting.append(ticket)
                ticket.position = position
        if position == 0:
            self._start(ticket)
        return ticket, position

    def cancel(self, ticket: Ticket) -> None:
        """Stop `ticket` wherever it is; a no-op once it has finished."""
        assert isinstance(ticket, RemoteTicket)  # this scheduler made it
        ticket.request.cancel.set()  # a running stream's backend closes the connection on this
        self._cancel_task(ticket)  # a stream on a loop closes it when its task is cancelled
        with self._lock:
            try:
                self._waiting.remove(ticket)
            except ValueError:
                return
            moved = [] if self._global else list(self._waiting)
        self._off_loop(self._release, ticket)  # other processes' waiters move up
        finish_cancelled(ticket)
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
            self._release(ticket)
            finish_cancelled(ticket)
        for ticket in running:
            ticket.request.cancel.set()
            self._cancel_task(ticket)
        self._pool.shutdown(wait=False)

    # -- admission ------------------------------------------------------------

    def _place_local(self, ticket: RemoteTicket) -> int:
        if len(self._running) < self.max_running and not self._waiting:
            return 0
        if len(self._waiting) >= self.max_waiting:
            raise QueueFull(
                f"the server is busy: {len(self._waiting)} answers are waiting; try again shortly"
            )
        return len(self._waiting) + 1

    @property
    def _shared(self) -> RedisAdmission:
        """The shared queue: only the global paths use it, and they exist only with one."""
        assert self._admission is not None
        return self._admission

    def _place_global(self, ticket: RemoteTicket) -> int:
        if len(self._waiting) >= self.max_waiting:
            raise QueueFull(
                f"the server is busy: {len(self._waiting)} answers are waiting; try again shortly"
            )
        ticket.admission_id = self._shared.new_id()
        try:
            return self._shared.join(
                ticket.admission_id, room=self.max_running - len(self._running)
            )
        except self._down as exc:
            ticket.admission_id = None
            self._fall_back(exc)
            return self._place_local(ticket)

    def _fall_back(self, exc: Exception) -> None:
        """Redis is away: admit by this process's own limit (called with the lock held)."""
        if self._global:
            log.warning(
                "the shared admission queue in Redis is unreachable (%s); admitting up to %d streams "
                "in this process alone until it answers again",
                exc,
                self.max_running,
            )
        self._global = False

    def _release(self, ticket: RemoteTicket) -> None:
        if ticket.admission_id is None or not self._global:
            return
        try:
            self._shared.release(ticket.admission_id)
        except self._down as exc:
            with self._lock:
                self._fall_back(exc)

    def _coordinate(self) -> None:
        """Renew leases, take this process's turns and tell waiters their positions, whenever the queue moves."""
        admission = self._shared
        while not self._closed:
            try:
                if self._global:
                    admission.wait(admission.renew_seconds)
                    self._tick()
                else:
                    time.sleep(admission.renew_seconds)
                    self._rejoin()
            except self._down as exc:
                with self._lock:
                    self._fall_back(exc)
                self._promote_local()
        admission.close()

    def _tick(self) -> None:
        with self._lock:
            if not self._global or self._closed:
                return
            runners = [t for t in self._running if t.admission_id]
            waiters = list(self._waiting)
            results = self._shared.admit(
                # every waiter joined the global queue, so each has an id
                cast("list[str]", [t.admission_id for t in runners + waiters]),
                room=self.max_running - len(self._running),
            )
            promoted, moved = [], []
            for ticket, position in zip(waiters, results[len(runners) :], strict=True):
                if (
                    position == -1
                ):  # our lease lapsed (this process stalled): queue again, at the back
                    position = self._shared.join(cast(str, ticket.admission_id), room=0)
                if position == 0:
                    self._waiting.remove(ticket)
                    self._running.add(ticket)
                    promoted.append(ticket)
                elif position != ticket.position:
                    ticket.position = position
                    moved.append(ticket)
        for ticket in promoted:
            self._start(ticket)
        for ticket in moved:
            ticket.sink(Queued(position=ticket.position))

    def _rejoin(self) -> None:
        """Redis answers again: this process's waiters join the global queue, oldest first."""
        with self._lock:
            if self._closed:
                return
            self._shared.client.ping()
            for ticket in self._waiting:
                ticket.admission_id = self._shared.new_id()
                self._shared.join(ticket.admission_id, room=0)
            self._global = True
        log.info("the shared admission queue in Redis answers again; using it")
        self._tick()

    def _promote_local(self) -> None:
        with self._lock:
            promoted = []
            while self._waiting and len(self._running) < self.max_running and not self._closed:
                ticket = self._waiting.popleft()
                self._running.add(ticket)
                promoted.append(ticket)
            moved = list(self._waiting) if promoted else []
        for ticket in promoted:
            self._start(ticket)
        _announce(moved)

    # -- worker ---------------------------------------------------------------

    def _start(self, ticket: RemoteTicket) -> None:
        """Stream `ticket` on its loop when it has one (and the backend an `agenerate`), else
        on a pool thread; any thread may call this."""
        loop = ticket.loop if self._agenerate is not None else None
        if loop is not None and _loop_here() is loop:
            ticket.task = loop.create_task(self._arun(ticket))
            return
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._start, ticket)
                return
            except RuntimeError:  # that loop is closed: nobody there listens any more
                pass
        self._pool.submit(self._run, ticket)

    def _cancel_task(self, ticket: RemoteTicket) -> None:
        """Cancel the task streaming `ticket` (its upstream closes at once), from any thread."""
        loop = ticket.loop
        if loop is None or self._agenerate is None:
            return
        if _loop_here() is loop:
            _cancel_begun(ticket)
        else:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(_cancel_begun, ticket)

    def _run(self, ticket: RemoteTicket) -> None:
        try:
            self._stream(ticket)
        finally:
            self._ended(ticket)

    async def _arun(self, ticket: RemoteTicket) -> None:
        ticket.begun = True
        try:
            await self._astream(ticket)
        finally:
            self._off_loop(self._ended, ticket)

    def _off_loop(self, call: Callable[[RemoteTicket], None], ticket: RemoteTicket) -> None:
        """`call(ticket)`, on a pool thread when it would give a global slot back (a Redis call
        must not hold up the event loop), else here."""
        if ticket.admission_id is not None and _loop_here() is not None:
            try:
                self._pool.submit(call, ticket)
                return
            except RuntimeError:  # closed: the pool takes no more work
                pass
        call(ticket)

    def _ended(self, ticket: RemoteTicket) -> None:
        with self._lock:
            self._running.discard(ticket)
        self._release(ticket)  # the coordinator hears of it and admits the next
        if not self._global:
            self._promote_local()

    def _stream(self, ticket: Ticket) -> None:
        request = ticket.request
        if request.cancel.is_set():  # cancelled between leaving the queue and starting
            finish_cancelled(ticket)
            return
        ticket.sink(Started(at=time.perf_counter()))
        try:
            result = self.backend.generate(request, lambda text: ticket.sink(TextChunk(text)))
        except Exception as exc:  # the queue must go on whatever one request does
            _failed(ticket, exc)
            return
        ticket.sink(Finished(result))

    async def _astream(self, ticket: RemoteTicket) -> None:
        """`_stream` on the loop: the same events, the sink called on the loop's thread."""
        request = ticket.request
        if request.cancel.is_set():
            finish_cancelled(ticket)
            return
        ticket.sink(Started(at=time.perf_counter()))
        agenerate: Any = self._agenerate
        try:
            result = await agenerate(request, lambda text: ticket.sink(TextChunk(text)))
        except Exception as exc:
            _failed(ticket, exc)
            return
        ticket.sink(Finished(result))


def _failed(ticket: Ticket, exc: Exception) -> None:
    request = ticket.request
    if isinstance(exc, EngineError):
        log.warning("generation failed for %s: %s", request.label or ticket.number, exc)
    else:
        log.exception("generation failed for %s", request.label or ticket.number)
    ticket.sink(
        Failed(
            error=f"{type(exc).__name__}: {exc}",
            at=time.perf_counter(),
            code=getattr(exc, "code", "model_error"),
        )
    )


def _loop_here() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _cancel_begun(ticket: RemoteTicket) -> None:
    """On the ticket's loop: cancel its task once begun (before, its cancel flag stops it)."""
    task = ticket.task
    if ticket.begun and task is not None and not task.done():
        task.cancel()


def _announce(tickets: list[RemoteTicket]) -> None:
    for index, ticket in enumerate(tickets):
        ticket.position = index + 1
        ticket.sink(Queued(position=index + 1))
