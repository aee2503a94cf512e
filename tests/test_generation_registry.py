"""Generations shared across processes: the Redis registry, and two Coalescers (two "processes")
on one Redis in front of a scripted scheduler. Real Redis; the real model's paths are in
tests/test_coalescing.py and tests/test_coalescing_across.py."""

from __future__ import annotations

import threading
import time
from typing import cast

import pytest

from chat.engine.sharing.coalescing import Coalescer
from chat.engine.sharing.coalescing_across import OWNER_GONE, AcrossProcesses
from chat.engine.sharing.generation_registry import GenerationRegistry, generation_id
from chat.engine.types import (
    Failed,
    Finished,
    GenerationRequest,
    GenerationResult,
    Queued,
    Started,
    TextChunk,
    Ticket,
)
from tests.conftest import TEST_CACHE_URL

pytestmark = pytest.mark.unit


@pytest.fixture
def registry():
    registry = GenerationRegistry(TEST_CACHE_URL, lease_seconds=5)
    yield registry
    registry.close()


def event(n: int, kind: str = "chunk", **fields) -> dict:
    return {"n": n, "t": kind, **fields}


def test_the_first_claim_owns_and_the_next_ones_listen(registry):
    assert registry.claim("g", "owner", "owner") is True
    assert registry.claim("g", "two", "two") is False
    assert registry.claim("g", "three", "three") is False
    assert registry.listeners("g") == 2
    assert registry.publish("g", "owner", [event(0, "started")]) == 2
    registry.leave("g", "two")
    assert registry.publish("g", "owner", []) == 1


def test_events_replay_in_order_and_a_finished_generation_is_claimed_anew(registry):
    assert registry.claim("g", "owner", "owner")
    registry.publish("g", "owner", [event(0, "started"), event(1, text="Hel")])
    registry.publish("g", "owner", [event(2, text="lo"), event(3, "finished")], final=True)
    replay = [data for _, data in registry.read("g")]
    assert [data["n"] for data in replay] == [0, 1, 2, 3]
    assert "".join(data.get("text", "") for data in replay) == "Hello"
    # Finished: no owner, so a listener's renewal says so, and the next request owns it anew,
    # with the old events gone.
    assert registry.renew("g", "late") is False
    assert registry.claim("g", "next", "next") is True
    assert registry.read("g") == []


def test_a_generation_is_given_up_only_when_no_listener_remains(registry):
    assert registry.claim("g", "owner", "owner")
    assert registry.claim("g", "follower", "follower") is False
    assert registry.abandon("g", "owner") is False  # someone still listens
    registry.leave("g", "follower")
    assert registry.abandon("g", "owner") is True
    assert registry.claim("g", "next", "next") is True  # nobody may join the stopped one


def test_leases_run_out_for_a_silent_owner_and_a_silent_listener():
    registry = GenerationRegistry(TEST_CACHE_URL, lease_seconds=1)
    try:
        assert registry.claim("g", "owner", "owner")
        assert registry.claim("g", "follower", "follower") is False
        time.sleep(1.5)
        # The follower's lease ran out: it no longer keeps the generation alive.
        assert registry.abandon("g", "owner") is True
        assert registry.claim("h", "owner", "owner")
        time.sleep(1.5)
        # The owner's lease ran out: it may not publish, a listener hears it is gone.
        assert registry.publish("h", "owner", [event(0, "started")]) == -1
        assert registry.read("h") == []
        assert registry.renew("h", "listener") is False
    finally:
        registry.close()


def test_a_blocking_read_returns_the_events_published_meanwhile(registry):
    assert registry.claim("g", "owner", "owner")
    later = threading.Timer(0.2, lambda: registry.publish("g", "owner", [event(0, "started")]))
    later.start()
    entries = registry.read("g", "0", block_seconds=5)
    later.join()
    assert [data["n"] for _, data in entries] == [0]


def test_the_generation_id_is_the_key_and_the_token_ids():
    assert generation_id("k", [1, 2]) == generation_id("k", [1, 2])
    assert generation_id("k", [1, 2]) != generation_id("k", [1, 3])  # a re-ask
    assert generation_id("k", [1, 2]) != generation_id("j", [1, 2])


# -- two processes' Coalescers on one Redis, in front of a scripted scheduler ---------------


class ScriptedScheduler:
    """Records what is submitted; the test plays each request's events."""

    def __init__(self):
        self.tickets: list[Ticket] = []
        self.cancelled: list[Ticket] = []

    def submit(self, request, sink, *, expected=False):
        ticket = Ticket(request, sink)
        self.tickets.append(ticket)
        sink(Queued(1))
        return ticket, 1

    def cancel(self, ticket):
        self.cancelled.append(ticket)
        ticket.sink(Finished(result("partial", "cancelled")))

    def expect(self):
        pass

    def unexpect(self):
        pass

    waiting = running = 0

    def close(self):
        pass


def result(text: str, reason: str = "eos") -> GenerationResult:
    now = time.perf_counter()
    return GenerationResult(text, reason, 3, 4, now - 1, now - 0.5, now)


class Listener:
    def __init__(self):
        self.events: list[object] = []
        self.done = threading.Event()
        self.chunk = threading.Event()

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, TextChunk):
            self.chunk.set()
        if isinstance(event, (Finished, Failed)):
            self.done.set()

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextChunk))


def process(lease_seconds: float = 5) -> Coalescer:
    coalescer = Coalescer()
    coalescer.across = AcrossProcesses(lambda: TEST_CACHE_URL, lease_seconds=lease_seconds)
    return coalescer


def request() -> GenerationRequest:
    return GenerationRequest.of([1, 2, 3, 4], max_new_tokens=8)


def play(ticket: Ticket, *chunks: str, end: str | None = None, start: bool = False) -> None:
    """With `start` Started first, then the chunks, then Finished with the whole text `end` if given."""
    if start:
        ticket.sink(Started(time.perf_counter()))
    for chunk in chunks:
        ticket.sink(TextChunk(chunk))
    if end is not None:
        ticket.sink(Finished(result(end)))


def published_started(owner: Coalescer, key: str) -> None:
    """Wait until the owner's publishing thread has put Started in the generation's stream
    (it writes a moment after the local listener heard it; a busy machine makes that longer)."""
    assert owner.across is not None
    registry = cast(AcrossProcesses, owner.across).registry()
    generation = generation_id(key, request().input_ids)
    deadline = time.monotonic() + 10
    while not any(data["t"] == "started" for _, data in registry.read(generation)):
        assert time.monotonic() < deadline, "the owner never published its start"
        time.sleep(0.01)


def test_a_second_process_follows_the_first_ones_generation_from_its_start():
    scheduler = ScriptedScheduler()
    a, b = process(), process()
    first, second = Listener(), Listener()
    a.sharing(scheduler, "key").submit(request(), first)
    play(scheduler.tickets[0], "Once ", start=True)
    published_started(a, "key")
    _, position = b.sharing(scheduler, "key").submit(request(), second)
    assert position == 0  # it had started
    assert second.chunk.wait(10)
    play(scheduler.tickets[0], "upon a time.", end="Once upon a time.")
    assert first.done.wait(10) and second.done.wait(10)
    assert len(scheduler.tickets) == 1 and b.across.joined == 1
    assert first.text == second.text == "Once upon a time."
    ends = [listener.events[-1].result for listener in (first, second)]
    assert [end.text for end in ends] == ["Once upon a time."] * 2
    assert ends[1].finish_reason == "eos" and ends[1].new_tokens == 3
    assert any(isinstance(e, Started) for e in second.events)


def test_a_followers_cancel_leaves_the_owner_running():
    scheduler = ScriptedScheduler()
    a, b = process(), process()
    owner, follower = Listener(), Listener()
    a.sharing(scheduler, "key").submit(request(), owner)
    play(scheduler.tickets[0], "Once ", start=True)
    view = b.sharing(scheduler, "key")
    ticket, _ = view.submit(request(), follower)
    assert follower.chunk.wait(10)
    view.cancel(ticket)
    assert follower.done.is_set()
    assert follower.events[-1].result.finish_reason == "cancelled"
    assert follower.events[-1].result.text == "Once "
    play(scheduler.tickets[0], "upon a time.", end="Once upon a time.")
    assert owner.done.wait(10) and owner.events[-1].result.finish_reason == "eos"
    assert scheduler.cancelled == []


def test_the_owners_cancel_leaves_a_follower_and_the_last_listener_stops_it():
    scheduler = ScriptedScheduler()
    a, b = process(lease_seconds=2), process(lease_seconds=2)
    owner, follower = Listener(), Listener()
    owner_view = a.sharing(scheduler, "key")
    owner_ticket, _ = owner_view.submit(request(), owner)
    play(scheduler.tickets[0], "Once ", start=True)
    follower_view = b.sharing(scheduler, "key")
    follower_ticket, _ = follower_view.submit(request(), follower)
    assert follower.chunk.wait(10)
    owner_view.cancel(owner_ticket)
    assert owner.events[-1].result.finish_reason == "cancelled"
    assert scheduler.cancelled == []  # still generating for the follower
    scheduler.tickets[0].sink(TextChunk("upon "))
    follower_view.cancel(follower_ticket)
    # The owner hears at its next renewal that nobody listens, and stops the generation.
    for _ in range(100):
        if scheduler.cancelled:
            break
        time.sleep(0.1)
    assert scheduler.cancelled == [scheduler.tickets[0]]
    assert owner.events[-1].result.finish_reason == "cancelled"  # told once, not twice
    assert sum(isinstance(e, Finished) for e in owner.events) == 1


def test_a_follower_of_an_owner_that_died_gets_a_failure():
    """The owner's process vanished: its lease runs out with no last event."""
    scheduler = ScriptedScheduler()
    dead = GenerationRegistry(TEST_CACHE_URL, lease_seconds=1)
    follower = Listener()
    try:
        identity = generation_id("key", request().input_ids)
        assert dead.claim(identity, "dead", "dead")
        dead.publish(identity, "dead", [event(0, "started"), event(1, text="Once ")])
        process(lease_seconds=1).sharing(scheduler, "key").submit(request(), follower)
        assert follower.done.wait(30)
    finally:
        dead.close()
    assert follower.text == "Once "
    assert isinstance(follower.events[-1], Failed)
    assert follower.events[-1].error == OWNER_GONE
    assert scheduler.tickets == []


def test_without_redis_each_process_generates_for_itself():
    scheduler = ScriptedScheduler()
    coalescer = Coalescer()
    coalescer.across = AcrossProcesses(lambda: "redis://127.0.0.1:9/0")
    listener = Listener()
    view = coalescer.sharing(scheduler, "key")
    view.submit(request(), listener)
    play(scheduler.tickets[0], "Hi.", end="Hi.", start=True)
    assert listener.done.wait(10) and listener.text == "Hi."
    assert len(scheduler.tickets) == 1 and coalescer.across.joined == 0


def test_the_owners_failure_and_queue_position_reach_a_follower():
    scheduler = ScriptedScheduler()
    a, b = process(), process()
    owner, follower = Listener(), Listener()
    a.sharing(scheduler, "key").submit(request(), owner)
    # Still queued (the scripted scheduler said position 1): the follower is told so.
    _, position = b.sharing(scheduler, "key").submit(request(), follower)
    assert position == 1
    play(scheduler.tickets[0], "Once ", start=True)
    scheduler.tickets[0].sink(Failed("the model broke", time.perf_counter()))
    assert owner.done.wait(10) and follower.done.wait(10)
    assert isinstance(follower.events[0], Queued) and follower.events[0].position == 1
    assert follower.text == "Once "
    assert isinstance(follower.events[-1], Failed)
    assert follower.events[-1].error == "the model broke"


def test_the_owner_gathers_its_text_into_few_writes_and_sends_the_rest_at_once(monkeypatch):
    """A round trip to Redis per token cost the web process more than relaying the token: the
    owner writes the text that came within a moment together, and its end without waiting."""
    writes: list[list[str]] = []
    real = GenerationRegistry.publish

    def publish(self, generation, token, payloads, **kwargs):
        writes.append([p["t"] for p in payloads])
        return real(self, generation, token, payloads, **kwargs)

    monkeypatch.setattr(GenerationRegistry, "publish", publish)
    scheduler = ScriptedScheduler()
    a, b = process(), process()
    owner, follower = Listener(), Listener()
    a.sharing(scheduler, "key").submit(request(), owner)
    b.sharing(scheduler, "key").submit(request(), follower)
    ticket = scheduler.tickets[0]
    play(ticket, start=True)
    for n in range(20):  # a token every 2 ms: faster than a write may follow another
        play(ticket, f"w{n} ")
        time.sleep(0.002)
    play(ticket, end="".join(f"w{n} " for n in range(20)))
    assert owner.done.wait(10) and follower.done.wait(10)
    assert follower.text == "".join(f"w{n} " for n in range(20))
    with_text = [kinds for kinds in writes if "chunk" in kinds]
    assert sum(len(kinds) for kinds in with_text) >= 20 and len(with_text) <= 5, writes


def test_an_unfollowed_owner_keeps_its_text_for_a_longer_wait_and_its_end_goes_at_once(
    monkeypatch,
):
    """Written for nobody, the text waits longer than a follower's tenth of a second (a round
    trip per answer every tenth of a second was a large part of a relayed answer's cost); the
    end still goes at once, with all of it."""
    from chat.engine.sharing import coalescing_across

    monkeypatch.setattr(coalescing_across, "PUBLISH_UNFOLLOWED_SECONDS", 30.0, raising=False)
    scheduler = ScriptedScheduler()
    a = process()
    owner = Listener()
    a.sharing(scheduler, "key").submit(request(), owner)
    ticket = scheduler.tickets[0]
    play(ticket, start=True)
    published_started(a, "key")
    play(ticket, "Once ", "more ")
    registry = cast(AcrossProcesses, a.across).registry()
    generation = generation_id("key", request().input_ids)
    time.sleep(0.5)  # five times a followed generation's wait
    assert not [d for _, d in registry.read(generation) if d["t"] == "chunk"]
    play(ticket, end="Once more ")
    assert owner.done.wait(10)
    deadline = time.monotonic() + 10
    while not any(d["t"] == "finished" for _, d in registry.read(generation)):
        assert time.monotonic() < deadline, "the owner never published its end"
        time.sleep(0.01)
    kinds = [d["t"] for _, d in registry.read(generation)]
    assert kinds.count("chunk") == 2, kinds


def hold_final_publish(process: Coalescer) -> threading.Event:
    """The owner's last publish waits until the returned event is set: the moment after its own
    listener heard the end (its turn sent `done`) and before any other process can see it."""
    registry = cast(AcrossProcesses, process.across).registry()
    publish, release = registry.publish, threading.Event()

    def held(*args, **kwargs):
        if kwargs.get("final"):
            release.wait(10)
        return publish(*args, **kwargs)

    registry.publish = held  # type: ignore[method-assign]
    return release


def test_a_repeat_just_after_the_end_follows_it_until_published_then_generates_anew():
    """A repeat in another process the moment the owner's listener had its Finished: before the
    last event is published it follows the generation and gets that end; after, it claims the
    generation anew and generates for itself. Never a wait without an end."""
    scheduler = ScriptedScheduler()
    a, b, c = process(), process(), process()
    release = hold_final_publish(a)
    owner, joiner, late = Listener(), Listener(), Listener()
    a.sharing(scheduler, "key").submit(request(), owner)
    play(scheduler.tickets[0], "Once.", start=True, end="Once.")
    assert owner.done.is_set()
    b.sharing(scheduler, "key").submit(request(), joiner)
    release.set()
    assert joiner.done.wait(10) and joiner.text == "Once."
    assert joiner.events[-1].result.finish_reason == "eos" and len(scheduler.tickets) == 1
    assert cast(AcrossProcesses, b.across).joined == 1  # it followed the owner's generation
    registry = cast(AcrossProcesses, a.across).registry()
    generation = generation_id("key", request().input_ids)
    deadline = time.monotonic() + 10
    while registry.client.exists(f"chat:generation:{generation}:owner"):
        assert time.monotonic() < deadline, "the owner never gave the generation up"
        time.sleep(0.01)
    c.sharing(scheduler, "key").submit(request(), late)
    assert len(scheduler.tickets) == 2  # claimed anew: its own generation
    play(scheduler.tickets[1], "Once.", start=True, end="Once.")
    assert late.done.wait(10) and late.text == "Once."


def test_an_engine_that_went_away_is_told_apart_across_processes():
    """The owner's engine stopped answering: the follower's Failed keeps its code, so its turn
    says `engine_unavailable` too, not a model error."""
    scheduler = ScriptedScheduler()
    a, b = process(), process()
    owner, follower = Listener(), Listener()
    a.sharing(scheduler, "key").submit(request(), owner)
    b.sharing(scheduler, "key").submit(request(), follower)
    play(scheduler.tickets[0], "Once ", start=True)
    scheduler.tickets[0].sink(Failed("gone", time.perf_counter(), code="engine_unavailable"))
    assert follower.done.wait(10) and isinstance(follower.events[-1], Failed)
    assert follower.events[-1].code == "engine_unavailable"


def test_a_follower_that_cannot_read_an_event_ends_with_a_failure_not_a_hang():
    """An entry the follower cannot decode (another version's, say) ends its request with Failed
    at once, instead of leaving its turn waiting for events that never come."""
    scheduler = ScriptedScheduler()
    other = GenerationRegistry(TEST_CACHE_URL, lease_seconds=5)
    follower = Listener()
    try:
        identity = generation_id("key", request().input_ids)
        assert other.claim(identity, "other", "other")
        other.publish(identity, "other", [event(0, "started"), event(1, "chunk")])  # no text
        process().sharing(scheduler, "key").submit(request(), follower)
        assert follower.done.wait(10)
    finally:
        other.close()
    assert isinstance(follower.events[-1], Failed) and scheduler.tickets == []
