"""A turn's events in a queue, for an HTTP response to hand on (the page's `/api` and `/v1`)."""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections

from ..protocol.events import Event
from ..turns import Following, Turn

log = logging.getLogger(__name__)

# A comment line now and then keeps proxies from closing a stream that waits in the queue.
KEEPALIVE_SECONDS = 15.0
KEEPALIVE = ": keepalive\n\n"  # an SSE comment line


async def release_database() -> None:
    """Give back the request's database connection before waiting on its turn, as Django does
    when a request ends: a response that streams an answer, or waits for the whole of it, is
    done with the database once the turn is admitted (what the turn stores, it stores through
    its own threads). Held, each answer running would keep a connection of PostgreSQL's pool.

    Where every database keeps its connections (SQLite's settings) there is nothing to give
    back, and the trip to the request's thread is skipped: the request's end still closes a
    connection an error left unusable."""
    if all(connections.settings[alias]["CONN_MAX_AGE"] is None for alias in connections):
        return
    await sync_to_async(close_old_connections)()


class TurnFeed:
    """Collects a turn's events in a queue for a response to hand on; ends when the turn does."""

    END = None

    def __init__(self):
        self.events: asyncio.Queue = asyncio.Queue()
        self.turn: Turn | None = None
        self.following: asyncio.Task | None = None
        self.sent = 0  # events sent so far: a quiet stream gets a KEEPALIVE

    async def send(self, event: Event) -> None:
        self.sent += 1
        self.events.put_nowait(event)  # the queue is unbounded: put never waits

    def follow(self, turn: Turn) -> None:
        """Queue END after the last event of `turn`, started with this feed's `send`."""
        self.turn = turn
        if turn.task is None:  # served from the cache: every event is already queued
            self.events.put_nowait(self.END)
        else:
            turn.task.add_done_callback(lambda _: self.events.put_nowait(self.END))

    async def batches_until_end(self):
        """The turn's events as they come, in lists of whatever was queued together (a response
        writes each list at once: one write through the server's layers, not one per event),
        and KEEPALIVE after a quiet KEEPALIVE_SECONDS (a comment line now and then keeps
        proxies from closing a stream waiting in the queue)."""
        await release_database()
        loop = asyncio.get_running_loop()
        # One timer for the whole stream, not one per wait: a wait per token is what a relay
        # does most, and asyncio.wait_for costs a task and a timer each time.
        heard = self.sent
        timer: asyncio.TimerHandle | None = None

        def tick() -> None:
            nonlocal heard, timer
            if self.sent == heard:  # nothing in the last KEEPALIVE_SECONDS
                self.events.put_nowait(KEEPALIVE)
            heard = self.sent
            timer = loop.call_later(KEEPALIVE_SECONDS, tick)

        timer = loop.call_later(KEEPALIVE_SECONDS, tick)
        try:
            while True:
                batch = [await self.events.get()]
                while not self.events.empty():
                    batch.append(self.events.get_nowait())
                end = next((i for i, event in enumerate(batch) if event is self.END), None)
                if end is not None:
                    if end:
                        yield batch[:end]
                    return
                yield batch
        finally:
            if timer is not None:
                timer.cancel()

    async def all_events(self) -> list[Event]:
        """Every event of the turn, once it has ended (a response that is not streamed)."""
        await release_database()
        collected = []
        while (event := await self.events.get()) is not self.END:
            collected.append(event)
        return collected

    def abandon(self, *, resumable: bool = False) -> None:
        """The client went away: stop the generation (the partial answer is still stored), or,
        when it may come back for the rest (`resumable`: SSE's Last-Event-ID), stop once the
        turn's grace period passed without a listener."""
        if self.following is not None:
            self.following.cancel()
        if self.turn is not None:
            self.turn.detach(self.send)
            if not resumable and not self.turn.finished:
                log.info("HTTP client of %s went away; cancelling", self.turn.request_id)
                self.turn.cancel()

    def follow_resumed(self, resumed: Turn | Following | None) -> None:
        """Like `follow`, for what chat/turns/resume.py gave this feed: a turn it attached to,
        an answer of another process it follows, or None (the answer's last event is queued)."""
        if isinstance(resumed, Following):
            self.following = resumed.task
            task: asyncio.Task | None = resumed.task
        else:
            self.turn = resumed
            task = resumed.task if resumed is not None else None
        if task is None or task.done():
            self.events.put_nowait(self.END)
        else:
            task.add_done_callback(lambda _: self.events.put_nowait(self.END))
