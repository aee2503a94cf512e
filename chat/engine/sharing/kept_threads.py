"""Threads for work that lasts as long as a generation, kept for the next one.

A shared generation's publisher (its owner) or follower runs on a thread of its own for the
whole answer. Starting a thread makes the caller wait until the OS has scheduled it: the
event loop, which submits every request, waited about 2 ms a request (8 users arriving
together on 2 busy cores). A thread that finished its work here waits for the next instead.
At most as many run as generations are shared at once (bounded by the engines' running and
waiting requests); beyond `keep_idle` idle ones, a finished thread ends.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Task = Callable[[], object]


class KeptThreads:
    """Daemon threads, each running one task at a time; idle ones wait for the next task."""

    def __init__(self, name: str, keep_idle: int = 16):
        self.name = name
        self.keep_idle = keep_idle
        self.started = 0
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Task]] = []  # the inboxes of threads waiting for work

    def run(self, task: Task) -> None:
        """Run `task` on an idle thread, or on a new one when none is idle."""
        with self._lock:
            idle = self._idle.pop() if self._idle else None
            if idle is None:
                self.started += 1
                number = self.started
        if idle is not None:
            idle.put(task)
            return
        inbox: queue.SimpleQueue[Task] = queue.SimpleQueue()
        inbox.put(task)
        threading.Thread(
            target=self._serve, args=(inbox,), name=f"{self.name}-{number}", daemon=True
        ).start()

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def _serve(self, inbox: queue.SimpleQueue[Task]) -> None:
        while True:
            task = inbox.get()
            try:
                task()
            except Exception:  # the task's own handling missed it; the thread goes on
                log.exception("%s: a task failed", self.name)
            with self._lock:
                if len(self._idle) >= self.keep_idle:
                    return
                self._idle.append(inbox)
