"""The threads shared generations publish and follow on are kept for the next generation
(chat/engine/sharing/kept_threads.py): a task after another runs on the same thread, tasks at
once each have one, a failed task does not end its thread, and idle threads beyond the stock
end. Then over real Redis: a second shared generation, published and followed, starts no
thread."""

from __future__ import annotations

import threading
import time

import pytest

from chat.engine.sharing.coalescing_across import sharing_threads
from chat.engine.sharing.kept_threads import KeptThreads
from tests.test_embedded_redis import wait_for
from tests.test_generation_registry import (
    Listener,
    ScriptedScheduler,
    play,
    process,
    published_started,
    request,
)

pytestmark = pytest.mark.unit


def ran_on(threads: KeptThreads, task=None) -> int:
    """The thread `threads` ran a task on (`task` run first, if given)."""
    done, seen = threading.Event(), []

    def noting() -> None:
        if task is not None:
            task()
        seen.append(threading.get_ident())
        done.set()

    threads.run(noting)
    assert done.wait(10)
    return seen[0]


def idle_at_least(threads: KeptThreads, count: int) -> None:
    wait_for(lambda: threads.idle >= count, f"{count} idle threads", timeout=10)


def test_a_task_after_another_runs_on_the_same_thread():
    threads = KeptThreads("test")
    first = ran_on(threads)
    idle_at_least(threads, 1)
    assert ran_on(threads) == first
    assert threads.started == 1


def test_tasks_at_once_each_have_a_thread_and_a_failed_one_keeps_its_thread():
    threads = KeptThreads("test")
    together = threading.Barrier(3, timeout=10)
    seen: list[int] = []

    def meeting() -> None:
        together.wait()  # with a thread shared between them, none would go on
        seen.append(threading.get_ident())

    for _ in range(3):
        threads.run(meeting)
    idle_at_least(threads, 3)
    assert len(set(seen)) == 3 and threads.started == 3

    def failing() -> None:
        raise RuntimeError("a task that fails")

    threads.run(failing)
    idle_at_least(threads, 3)
    assert ran_on(threads) in seen and threads.started == 3


def test_idle_threads_beyond_the_stock_end():
    threads = KeptThreads("test", keep_idle=1)
    release = threading.Event()
    for _ in range(2):
        threads.run(release.wait)
    release.set()
    idle_at_least(threads, 1)
    time.sleep(0.1)  # the second one to finish ends rather than wait
    assert threads.idle == 1
    assert ran_on(threads) and threads.started == 2


def test_a_second_shared_generation_publishes_and_follows_on_kept_threads():
    """An owner's publisher and a follower in another process (the same Redis), twice: the
    second time both run on threads the first left idle."""

    def shared_once(key: str) -> None:
        scheduler = ScriptedScheduler()
        a, b = process(), process()
        first, second = Listener(), Listener()
        a.sharing(scheduler, key).submit(request(), first)
        play(scheduler.tickets[0], "Once ", start=True)
        published_started(a, key)
        b.sharing(scheduler, key).submit(request(), second)
        assert second.chunk.wait(10)
        play(scheduler.tickets[0], "upon a time.", end="Once upon a time.")
        assert first.done.wait(10) and second.done.wait(10)
        assert first.text == second.text == "Once upon a time."

    shared_once(f"kept-threads-{time.time_ns()}")
    idle_at_least(sharing_threads, 2)
    started = sharing_threads.started
    shared_once(f"kept-threads-{time.time_ns()}")
    assert sharing_threads.started == started
