"""Django's ASGI handler, with the thread each request's sync code runs in kept for the next one.

Django runs a request's sync code (the ORM, sessions) in a thread of its own, made for the
request and joined after it, so every request also opened the database anew in that thread.
On SQLite that was the largest single cost of a request: the connection, Django's SQL functions
registered on it, the WAL pragmas, and on close a checkpoint of the log (about 3 ms of the 33
of a relayed `/v1` answer). Here a request borrows a one-thread executor from a small stock and
gives it back when it ends; the thread's connection stays open between requests where the
database settings keep connections (SQLite: project/settings_parsers.py; PostgreSQL hands its
connection back to the pool instead). Each request still has its thread to itself for as long
as it runs, which is what Django's thread-sensitive sync code needs; only the thread outlives
it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext
from django.core.handlers.asgi import ASGIHandler
from django.db import connections

# Threads kept idle at most: as many as requests usually run at once; a burst beyond it makes
# threads that end (their connections closed) once their requests do.
KEEP_IDLE = 16


class RequestThreads:
    """One-thread executors, one per running request, the idle ones kept. Used on the event
    loop's thread only, so a list needs no lock."""

    def __init__(self, keep_idle: int = KEEP_IDLE):
        self.keep_idle = keep_idle
        self.idle: list[ThreadPoolExecutor] = []
        self.made = 0

    def take(self) -> ThreadPoolExecutor:
        if self.idle:
            return self.idle.pop()  # the most recently used: its connection is the freshest
        self.made += 1
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="django-request")

    def give_back(self, executor: ThreadPoolExecutor) -> None:
        if len(self.idle) < self.keep_idle:
            self.idle.append(executor)
            return
        # Its connections are closed in the thread that opened them (Django's are per thread).
        executor.submit(connections.close_all)
        executor.shutdown(wait=False)


class KeptThreadsASGIHandler(ASGIHandler):
    """Django's ASGIHandler, each request's sync code in a thread borrowed from `threads`."""

    def __init__(self, threads: RequestThreads | None = None):
        super().__init__()
        self.threads = threads if threads is not None else RequestThreads()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self.threads.take()
        try:
            # The executor is the request's own while it runs: asgiref sends every
            # thread-sensitive call made in this block to it, and leaves it running after.
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            self.threads.give_back(executor)
