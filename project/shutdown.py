"""A clean stop under daphne: on SIGTERM (or Ctrl-C) drain, then stop the server.

daphne's own SIGTERM handling is Twisted's: `reactor.stop()` at once, whose before-shutdown
trigger (`Server.kill_all_applications`) cancels every connection's application: a running
answer's socket just drops, a server-sent stream is cut off mid-event. Its
`--application-close-timeout` only bounds how long a *disconnected* client's application may
take to finish; it does not delay a shutdown. So once the reactor runs, this module puts its
own handler on SIGTERM and SIGINT (Twisted installs its handlers while the reactor starts,
so ours are installed just after, with `callWhenRunning`), which:

1. marks the process draining (`runtime.draining`): /healthz answers 503 "draining", new
   prompts get `error` `server_restarting` (HTTP 503), a reconnecting page is told the same;
2. lets running answers finish for up to CHAT_DRAIN_SECONDS, then cancels the rest; every
   answer is stored, none is left `streaming` (chat/turns/running.py `turns_drain`);
3. waits for the HTTP responses still open (server-sent streams end with their `done`);
4. closes every chat socket with 4012 (the page reconnects and says the server restarted);
5. stops the reactor, and the process exits without the interpreter's teardown of torch and
   transformers' objects (2-3 s that a stopped server does not need: everything is stored,
   the sockets are closed, the logs are flushed).

A second signal while draining stops at once, as daphne would have.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import sys
import time

from django.conf import settings

from chat import turns
from chat.infra.runtime import runtime
from chat.transports.consumers import sockets_close

log = logging.getLogger(__name__)


class RequestsInFlight:
    """ASGI middleware counting the HTTP requests being answered, so a drain can wait for them."""

    def __init__(self, app):
        self.app = app
        self.count = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        self.count += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.count -= 1

    async def wait_idle(self, timeout: float, *, leave: int = 0) -> None:
        """Until at most `leave` requests are open, or `timeout` seconds passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.count > leave and loop.time() < deadline:
            await asyncio.sleep(0.02)


async def drain(requests: RequestsInFlight, seconds: float) -> None:
    """Steps 2-4 above; step 1 is already done."""
    started = time.perf_counter()
    finished, cancelled = await turns.turns_drain(seconds)
    await requests.wait_idle(5.0)  # a stream writes its `done` and ends just after its turn
    closed = await sockets_close()
    log.info(
        "drained in %.2f s: %d answer(s) finished, %d cancelled, %d socket(s) closed",
        time.perf_counter() - started,
        finished,
        cancelled,
        closed,
    )


def _exit_now() -> None:
    """The last step of a drained stop: flush what is buffered, skip the interpreter's teardown."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class Stopper:
    """Owns the signal handlers of one daphne process."""

    def __init__(self, requests: RequestsInFlight):
        self.requests = requests
        self.task: asyncio.Task | None = None

    def install(self) -> None:
        """Take over SIGTERM and SIGINT once the reactor runs (no-op outside daphne)."""
        if "twisted.internet.reactor" not in sys.modules:
            return  # not under daphne (tests' communicator, manage.py commands)
        # Imported only here and below: importing it first would install Twisted's default
        # reactor, and daphne could not install its asyncio one.
        from twisted.internet import reactor

        reactor.callWhenRunning(self._take_signals)

    def _take_signals(self) -> None:
        signal.signal(signal.SIGTERM, self._signalled)
        signal.signal(signal.SIGINT, self._signalled)

    def _signalled(self, number: int, frame) -> None:
        from twisted.internet import reactor

        # A signal handler runs between two bytecodes of the main thread: hand over to the loop.
        reactor.callFromThread(self._begin, signal.Signals(number).name)

    def _begin(self, name: str) -> None:
        from twisted.internet import reactor

        if self.task is not None:
            log.warning("%s again while draining: stopping now", name)
            reactor.stop()
            return
        seconds = settings.CHAT_DRAIN_SECONDS
        log.info("%s: draining (running answers get up to %s s), then stopping", name, seconds)
        runtime.draining = True
        self.task = asyncio.get_event_loop().create_task(drain(self.requests, seconds))
        self.task.add_done_callback(self._drained)

    def _drained(self, task: asyncio.Task) -> None:
        from twisted.internet import reactor

        if not task.cancelled() and task.exception() is not None:
            log.error("drain failed", exc_info=task.exception())
        # Registered last, so it runs first among the exit handlers, after daphne and
        # project.serve (which releases the embedded Redis) have returned.
        atexit.register(_exit_now)
        if reactor.running:
            reactor.stop()
