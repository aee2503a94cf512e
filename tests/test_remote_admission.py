"""Two schedulers ("processes") sharing one admission queue in real Redis, streaming from the loopback server."""

from __future__ import annotations

import logging
import uuid

import pytest
import redis

from chat.engine.remote.concurrent import ConcurrentScheduler
from chat.engine.remote.global_queue import RedisAdmission
from chat.engine.types import Finished, Queued, Started, TextChunk
from harness.liveserver import free_port
from harness.openai_server import FakeOpenAIServer

from .conftest import TEST_CACHE_URL
from .test_remote import COUNT, STORY, Events, remote_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fake(backend):
    server = FakeOpenAIServer(backend).start()
    yield server
    server.stop()


@pytest.fixture
def queue_name():
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(TEST_CACHE_URL)
    client.delete(*client.keys(f"chat:admission:{name}:*") or ["-"])
    client.close()


@pytest.fixture
def schedulers():
    made: list[ConcurrentScheduler] = []

    def make(
        backend,
        name: str,
        *,
        capacity: int,
        max_running: int = 4,
        lease_seconds: float = 5,
        url=TEST_CACHE_URL,
    ):
        admission = RedisAdmission(url, name, capacity=capacity, lease_seconds=lease_seconds)
        scheduler = ConcurrentScheduler(backend, max_running=max_running, admission=admission)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.close()


def positions(sink: Events) -> list[int]:
    with sink.cond:
        return [e.position for e in sink.items if isinstance(e, Queued)]


def test_two_processes_share_global_capacity_and_global_positions(
    fake, backend, queue_name, schedulers
):
    """Capacity 2 across two schedulers with room for 4 each: two streams upstream, waiters numbered in one queue,
    and a slot freed in one process goes to the global head even when it belongs to the other."""
    remote = remote_for(fake, backend)
    a = schedulers(remote, queue_name, capacity=2)
    b = schedulers(remote, queue_name, capacity=2)
    order = [(a, "a1"), (b, "b1"), (a, "a2"), (b, "b2"), (a, "a3")]
    sinks = {label: Events() for _, label in order}
    tickets, placed = {}, {}
    before = len(fake.served)
    try:
        for scheduler, label in order:
            tickets[label], placed[label] = scheduler.submit(
                remote.request(STORY, max_new_tokens=200), sinks[label]
            )
        assert placed == {"a1": 0, "b1": 0, "a2": 1, "b2": 2, "a3": 3}
        sinks["a1"].wait(TextChunk)
        sinks["b1"].wait(TextChunk)
        assert fake.active == 2 and len(fake.served) - before == 2
        assert (a.running, a.waiting, b.running, b.waiting) == (1, 2, 1, 1)

        a.cancel(tickets["a2"])  # a waiter in process A: B's waiter moves up
        assert fake.wait_for(
            lambda: positions(sinks["b2"])[-1:] == [1] and positions(sinks["a3"])[-1:] == [2]
        )

        b.cancel(
            tickets["b1"]
        )  # a slot frees in B: the global head (B's) starts, A's waiter is next
        sinks["b2"].wait(TextChunk)
        assert fake.wait_for(lambda: positions(sinks["a3"])[-1:] == [1])
        assert not sinks["a3"].has(Started) and (a.running, b.running) == (1, 1)
        assert a._admission.counts() == (2, 1)  # (running, waiting) in the global queue

        a.cancel(tickets["a1"])  # a slot frees in A: A's waiter starts
        sinks["a3"].wait(TextChunk)
        assert not sinks["a2"].has(Started)
    finally:
        for scheduler, label in order:
            scheduler.cancel(tickets[label])
        for sink in sinks.values():
            sink.wait(Finished)


def test_a_dead_processes_tickets_expire_and_stop_blocking_the_queue(
    fake, backend, queue_name, schedulers
):
    """A process that died holding the only slot, and another that died waiting, block a live process only
    until their leases run out; then it streams."""
    dead = RedisAdmission(TEST_CACHE_URL, queue_name, capacity=1, lease_seconds=1)
    assert dead.join("ghost-running") == 0 and dead.join("ghost-waiting") == 1
    dead.close()  # never renewed again
    remote = remote_for(fake, backend)
    live = schedulers(remote, queue_name, capacity=1, lease_seconds=3)
    sink = Events()
    _, position = live.submit(remote.request(COUNT, max_new_tokens=3), sink)
    assert position == 2
    assert sink.wait(Finished).result.new_tokens == 3
    assert sink.has(Started)
    client = redis.Redis.from_url(TEST_CACHE_URL)
    try:
        names = [m.decode() for m in client.zrange(f"chat:admission:{queue_name}:leases", 0, -1)]
    finally:
        client.close()
    assert "ghost-running" not in names and "ghost-waiting" not in names


def test_an_unreachable_redis_falls_back_to_the_per_process_limit(
    fake, backend, schedulers, caplog
):
    """With nobody at the Redis address the scheduler logs it and admits up to its own limit, in order."""
    remote = remote_for(fake, backend)
    scheduler = schedulers(
        remote, "unreachable", capacity=5, max_running=1, url=f"redis://127.0.0.1:{free_port()}/0"
    )
    first, second = Events(), Events()
    with caplog.at_level(logging.WARNING, logger="chat.engine.remote.concurrent"):
        _, p1 = scheduler.submit(remote.request(COUNT, max_new_tokens=3), first)
        _, p2 = scheduler.submit(remote.request(COUNT, max_new_tokens=3), second)
    assert (p1, p2) == (0, 1)
    assert "unreachable" in caplog.text
    assert first.wait(Finished).result.new_tokens == 3
    assert second.wait(Finished).result.new_tokens == 3


async def test_on_an_event_loop_a_global_slot_given_back_starts_the_next_stream_on_that_loop(
    fake, backend, queue_name, schedulers
):
    """Streams on the loop under the global queue: the one waiting is started by the
    coordinator's thread when the first's slot comes back (given back off the loop), and still
    streams as a task on the loop it was submitted from, its events on that loop's thread."""
    import asyncio
    import threading

    remote = remote_for(fake, backend)
    scheduler = schedulers(remote, queue_name, capacity=1)
    loop_thread = threading.get_ident()
    first: list = []
    second: list = []

    def sink(into: list):
        return lambda event: into.append((event, threading.get_ident()))

    one, at_one = scheduler.submit(remote.request(COUNT, max_new_tokens=12), sink(first))
    two, at_two = scheduler.submit(remote.request(COUNT, max_new_tokens=12), sink(second))
    assert (at_one, at_two) == (0, 1) and one.task is not None and two.task is None
    deadline = asyncio.get_running_loop().time() + 120
    while not any(isinstance(e, Finished) for e, _ in second):
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)
    assert two.task is not None
    # A new queue position would come from the coordinator's thread; the stream's own events
    # come from the loop.
    streamed = [thread for e, thread in first + second if not isinstance(e, Queued)]
    assert set(streamed) == {loop_thread}
    assert next(e for e, _ in second if isinstance(e, Finished)).result.text
