"""Identical prompts in flight share one generation across processes, through Redis.

Under the in-process Coalescer (coalescing.py), which already folds a process's identical
requests into one: that one request either claims the generation in the registry
(generation_registry.py) and runs it here, publishing every event to the generation's
stream, or finds it owned by another process and follows that stream instead of
generating: it replays the events from the first and then blocks for the live ones.

- The owner renews its lease each time it publishes (and at least every `renew_seconds`);
  a follower renews its own listener lease while it follows.
- A follower's cancel only removes its listener. The owner's own listeners leaving does not
  stop the generation while a follower's lease runs: they are detached (Finished
  "cancelled" with the text they had) and the generation goes on for the followers; it is
  stopped once the last listener anywhere is gone.
- The owner gone (its lease ran out with no final event; a killed process), a gap in the
  events or an event it cannot read: the follower ends with Failed, so its turn sends an error
  and stores the failure; it never waits longer than a lease and a renewal. It does not
  generate the answer itself: part of the text may already be on the user's screen, and a new
  generation (sampled, or after a model reload) need not continue it.
- A request for a generation that has just ended (its answer not cached yet): until the
  owner's last event is published, the owner still holds it, so the request follows it and
  gets that last event from the stream; once published, the ownership is given up in the same
  step, so the request claims the generation anew and generates for itself.
- Redis unreachable: the request simply runs in this process (after a failure, Redis is not
  asked again for `backoff_seconds`), so coalescing degrades to in-process only.

Sinks are called outside this module's locks; an event that reaches the Coalescer after its
generation closed is dropped there.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..types import (
    Event,
    Failed,
    Finished,
    GenerationRequest,
    GenerationResult,
    Scheduler,
    Sink,
    TextChunk,
    Ticket,
)
from .generation_registry import GenerationRegistry, generation_id
from .kept_threads import KeptThreads
from .stream_events import decode, encode

log = logging.getLogger(__name__)

OWNER_GONE = "the process generating this answer for several requests stopped before it finished"
EVENTS_LOST = "the events of the generation this request shared were lost"
REDIS_LOST = "Redis, which carried the generation this request shared, stopped answering"


CountTokens = Callable[[str], int]

# How long the publisher gathers text chunks before one write to Redis (any other event, the
# end, a queue position, goes at once): a round trip per token would cost the web process more
# than relaying the token itself, and a follower a tenth of a second behind reads the same answer.
PUBLISH_SECONDS = 0.1
# As long as no other process follows the generation (the last write counted no listener), text
# waits this long instead: written for nobody yet, it would cost the web process a round trip
# per answer every tenth of a second. A follower that joins reads what was written, gets the
# rest within this wait, and a tenth of a second behind from the next write on.
PUBLISH_UNFOLLOWED_SECONDS = 0.5

# Each owned generation's publisher and each followed one's reader, for its whole answer.
sharing_threads = KeptThreads("chat-sharing")


def cancelled_result(
    pieces: list[str], prompt_tokens: int, count_tokens: CountTokens | None
) -> GenerationResult:
    """What a listener that leaves a shared generation gets: the text it had, and its tokens (what
    its turn is charged): the tokenizer's count of the text, at least one per piece (each came
    from a decode step of its own, or more)."""
    text = "".join(pieces)
    tokens = max(count_tokens(text) if count_tokens is not None and text else 0, len(pieces))
    now = time.perf_counter()
    return GenerationResult(text, "cancelled", tokens, prompt_tokens, now, None, now)


class _Owned:
    """A generation this process runs for its own listener and for followers elsewhere."""

    def __init__(
        self,
        registry: GenerationRegistry,
        generation: str,
        token: str,
        scheduler: Scheduler,
        sink: Sink,
        request: GenerationRequest,
        on_end: Callable[[], None],
        count_tokens: CountTokens | None = None,
    ):
        self.registry, self.generation, self.token = registry, generation, token
        self.count_tokens = count_tokens
        self.scheduler = scheduler
        self.prompt_tokens = len(request.input_ids)
        self.tag = request.tag
        self.on_end = on_end
        self.ticket: Ticket | None = None
        self._local: Sink | None = sink  # None once this process's listener left
        self._lock = threading.Lock()
        self._text: list[str] = []
        self._ended = False
        self._stopping = False
        self._outbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._urgent = threading.Event()  # an event other than text is in the outbox: publish now

    def start(self, ticket: Ticket) -> None:
        self.ticket = ticket
        sharing_threads.run(self._publish_loop)

    def sink(self, event: Event) -> None:
        """The scheduler's sink (engine thread): never blocks on Redis; the publisher thread does."""
        with self._lock:
            if isinstance(event, TextChunk):
                self._text.append(event.text)
            elif isinstance(event, (Finished, Failed)):
                self._ended = True
            local = self._local
        self._outbox.put(event)
        if not isinstance(event, TextChunk):
            self._urgent.set()
        if local is not None:
            local(event)

    def fail_unstarted(self, error: str) -> None:
        """The scheduler refused it: followers that joined meanwhile get the failure."""
        try:
            self.registry.publish(
                self.generation,
                self.token,
                [encode(Failed(error, 0.0), 0)],
                final=True,
                tag=self.tag,
            )
        except self.registry.errors:
            log.warning("could not publish the refusal of shared generation %s", self.generation)

    def cancel(self) -> None:
        """This process's last listener left: stop, unless a follower elsewhere still listens."""
        with self._lock:
            if self._ended or self._local is None:
                return
        try:
            alone = self.registry.abandon(self.generation, self.token)
        except self.registry.errors:
            alone = True  # no follower can be reached any more
        if alone:
            self._stop()  # its own Finished reaches the listener, as without sharing
            return
        with self._lock:
            local, self._local = self._local, None
            pieces = list(self._text)
        if local is not None:
            local(Finished(cancelled_result(pieces, self.prompt_tokens, self.count_tokens)))

    def _stop(self) -> None:
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        if self.ticket is not None:
            self.scheduler.cancel(self.ticket)

    def _publish_loop(self) -> None:
        n, broken, followed = 0, False, False
        try:
            while True:
                try:
                    batch = [self._outbox.get(timeout=self.registry.renew_seconds)]
                except queue.Empty:
                    batch = []  # nothing new: renew the lease all the same
                if batch:  # gather the text that follows
                    self._urgent.wait(PUBLISH_SECONDS if followed else PUBLISH_UNFOLLOWED_SECONDS)
                    self._urgent.clear()
                while not self._outbox.empty():
                    batch.append(self._outbox.get_nowait())
                final = any(isinstance(event, (Finished, Failed)) for event in batch)
                listeners = -1
                if not broken:
                    payloads = [encode(event, n + i) for i, event in enumerate(batch)]
                    n += len(batch)
                    try:
                        listeners = self.registry.publish(
                            self.generation, self.token, payloads, final=final, tag=self.tag
                        )
                    except self.registry.errors as exc:
                        log.warning(
                            "shared generation %s: Redis failed (%s); followers will see it end",
                            self.generation,
                            exc,
                        )
                    # A lost lease or Redis: followers see the owner gone; stop publishing.
                    broken = listeners < 0
                    followed = listeners > 0
                if final:
                    return
                with self._lock:
                    detached = self._local is None
                if detached and listeners <= 0 and (broken or self._abandoned()):
                    self._stop()
        finally:
            self.on_end()

    def _abandoned(self) -> bool:
        try:
            return self.registry.abandon(self.generation, self.token)
        except self.registry.errors:
            return True


class _Followed:
    """Another process's generation, followed from its stream for this process's listeners."""

    def __init__(
        self,
        registry: GenerationRegistry,
        generation: str,
        listener: str,
        ticket: Ticket,
        on_end: Callable[[], None],
        count_tokens: CountTokens | None = None,
    ):
        self.registry, self.generation, self.listener = registry, generation, listener
        self.count_tokens = count_tokens
        self.ticket = ticket
        self.on_end = on_end
        self._lock = threading.Lock()
        self._text: list[str] = []
        self._ended = False
        self._next = 0  # the sequence number the next event must carry

    def start(self) -> int:
        """Start following; the queue position to report now (0 once it started)."""
        position = 0
        try:
            for _, data in self.registry.read(self.generation):
                position = int(data["position"]) if data["t"] == "queued" else 0
        except self.registry.errors:
            pass  # the follower finds out for itself
        sharing_threads.run(self._follow)
        return position

    def cancel(self) -> None:
        """This process's last listener left: it alone stops listening; the generation goes on."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            pieces = list(self._text)
        with contextlib.suppress(*self.registry.errors):  # else its lease runs out instead
            self.registry.leave(self.generation, self.listener)
        prompt_tokens = len(self.ticket.request.input_ids)
        self.ticket.sink(Finished(cancelled_result(pieces, prompt_tokens, self.count_tokens)))

    def _deliver(self, entries: list[tuple[str, dict[str, Any]]]) -> str | None:
        """Hand events on in order; the stream id read up to, or None once it ended."""
        after = None
        for entry_id, data in entries:
            after = entry_id
            if data.get("n") != self._next:
                self._end(Failed(EVENTS_LOST, time.perf_counter()))
                return None
            self._next += 1
            event = decode(data)
            with self._lock:
                if self._ended:
                    return None
                if isinstance(event, TextChunk):
                    self._text.append(event.text)
                last = isinstance(event, (Finished, Failed))
                self._ended = last
            self.ticket.sink(event)
            if last:
                return None
        return after

    def _end(self, event: Failed) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self.ticket.sink(event)

    def _follow(self) -> None:
        registry = self.registry
        after = "0"
        renew_at = time.monotonic() + registry.renew_seconds
        try:
            while not self._ended:
                entries = registry.read(self.generation, after, registry.renew_seconds)
                read_to = self._deliver(entries)
                if read_to is None and entries:
                    return
                after = read_to or after
                if self._ended:
                    return
                if entries and time.monotonic() < renew_at:
                    continue
                renew_at = time.monotonic() + registry.renew_seconds
                if not registry.renew(self.generation, self.listener, self.ticket.request.tag):
                    # No owner: a finished one published its last event first; read what is left.
                    tail = registry.read(self.generation, after)
                    if self._deliver(tail) is None and tail:
                        return
                    self._end(Failed(OWNER_GONE, time.perf_counter()))
        except registry.errors as exc:
            log.warning("following shared generation %s: Redis failed (%s)", self.generation, exc)
            self._end(Failed(REDIS_LOST, time.perf_counter()))
        except Exception:
            # Whatever broke (an entry this version cannot read), its turn must end, not wait.
            log.exception("following shared generation %s failed", self.generation)
            self._end(Failed(EVENTS_LOST, time.perf_counter()))
        finally:
            with contextlib.suppress(*registry.errors):
                registry.leave(self.generation, self.listener)
            self.on_end()


class AcrossProcesses:
    """The Coalescer's way to a scheduler when several processes share one Redis.

    Args:
        url: the Redis URL, read at each request (settings may change it; tests do).
        lease_seconds: how long an owner or listener may go unheard before it counts as gone.
    """

    backoff_seconds = 2.0

    def __init__(
        self,
        url: Callable[[], str],
        *,
        lease_seconds: float = 10.0,
        count_tokens: CountTokens | None = None,
    ):
        self.url = url
        self.lease_seconds = lease_seconds
        self.count_tokens = count_tokens  # a leaving listener's tokens (cancelled_result)
        self.joined = 0  # requests that followed another process's generation
        self._registries: dict[str, GenerationRegistry] = {}
        self._handles: dict[int, _Owned | _Followed] = {}  # by id of the ticket handed out
        self._lock = threading.Lock()
        self._retry_at = 0.0
        self._warned = False

    def registry(self) -> GenerationRegistry:
        url = self.url()
        with self._lock:
            if url not in self._registries:
                self._registries[url] = GenerationRegistry(url, lease_seconds=self.lease_seconds)
            return self._registries[url]

    def submit(
        self,
        scheduler: Scheduler,
        key: str,
        request: GenerationRequest,
        sink: Sink,
        expected: bool,
    ) -> tuple[Ticket, int]:
        if time.monotonic() < self._retry_at:
            return scheduler.submit(request, sink, expected=expected)
        registry = self.registry()
        generation = generation_id(key, request.input_ids)
        token = registry.new_id()
        try:
            owns = registry.claim(generation, token, token, request.tag)
        except registry.errors as exc:
            self._unavailable(exc)
            return scheduler.submit(request, sink, expected=expected)
        self._warned = False
        if owns:
            owned = _Owned(
                registry,
                generation,
                token,
                scheduler,
                sink,
                request,
                lambda: self._forget(owned),
                self.count_tokens,
            )
            try:
                ticket, position = scheduler.submit(request, owned.sink, expected=expected)
            except Exception as exc:
                owned.fail_unstarted(str(exc))
                raise
            self._remember(ticket, owned)
            owned.start(ticket)
            return ticket, position
        if expected:
            scheduler.unexpect()  # announced to the scheduler, but it never runs here
        followed = _Followed(
            registry,
            generation,
            token,
            Ticket(request, sink),
            lambda: self._forget(followed),
            self.count_tokens,
        )
        self._remember(followed.ticket, followed)
        self.joined += 1
        return followed.ticket, followed.start()

    def cancel(self, scheduler: Scheduler, ticket: Ticket) -> None:
        with self._lock:
            handle = self._handles.get(id(ticket))
        if handle is None or handle.ticket is not ticket:
            scheduler.cancel(ticket)  # ran unshared (Redis was away), or finished already
        else:
            handle.cancel()

    def in_flight(self) -> int:
        with self._lock:
            return len(self._handles)

    def _remember(self, ticket: Ticket, handle: _Owned | _Followed) -> None:
        with self._lock:
            self._handles[id(ticket)] = handle

    def _forget(self, handle: _Owned | _Followed) -> None:
        with self._lock:
            if handle.ticket is not None and self._handles.get(id(handle.ticket)) is handle:
                del self._handles[id(handle.ticket)]

    def _unavailable(self, exc: Exception) -> None:
        self._retry_at = time.monotonic() + self.backoff_seconds
        if not self._warned:
            log.warning(
                "coalescing across processes unavailable (%s: %s); identical prompts are shared "
                "within each process only",
                type(exc).__name__,
                exc,
            )
            self._warned = True
