"""A Redis client that fails fast: short timeouts, and a back-off once Redis is down.

The completion cache and the shared rate limit both go on without Redis (uncached, or counted
in this process); while it is away they should not each wait on a timeout per request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis

log = logging.getLogger(__name__)

T = TypeVar("T")


class RedisGuard:
    """Runs Redis calls for one feature; after a failure, answers "unavailable" at once for
    `backoff_seconds` before trying Redis again.

    Args:
        feature: names the feature in log lines ("completion cache").
        url: the Redis URL, read at every call (tests and settings may change it).
        fallback: what the feature does without Redis, for the log ("chat continues uncached").
        on_error: called with the operation's name on each failure (a metric).
    """

    backoff_seconds = 2.0

    def __init__(
        self,
        feature: str,
        url: Callable[[], str],
        fallback: str,
        on_error: Callable[[str], None] = lambda _operation: None,
    ):
        self.feature = feature
        self.url = url
        self.fallback = fallback
        self.on_error = on_error
        self.available = True
        self.errors = 0
        self.last_error = ""
        self._retry_at = 0.0
        self._lock = threading.Lock()
        self._clients: dict[str, redis.Redis] = {}

    def client(self) -> redis.Redis:
        url = self.url()
        with self._lock:
            if url not in self._clients:
                self._clients[url] = redis.Redis.from_url(
                    url, socket_timeout=0.5, socket_connect_timeout=0.5, health_check_interval=10
                )
            return self._clients[url]

    def call(self, operation: str, fn: Callable[[redis.Redis], T]) -> tuple[bool, T | None]:
        """(True, fn's result), or (False, None) when Redis failed now or recently."""
        if not self.available and time.monotonic() < self._retry_at:
            return False, None
        try:
            value = fn(self.client())
        except (redis.RedisError, OSError) as exc:
            self._failed(operation, exc)
            return False, None
        self._answered()
        return True, value

    def _failed(self, operation: str, exc: Exception) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.available:
            log.warning("%s unavailable (%s); %s", self.feature, self.last_error, self.fallback)
        self.available = False
        self._retry_at = time.monotonic() + self.backoff_seconds
        self.on_error(operation)

    def _answered(self) -> None:
        if not self.available:
            log.info("%s is back", self.feature)
            self.available = True

    def status(self, degraded: str) -> str:
        """ "ok", or what is wrong and `degraded`, what the feature does meanwhile.

        Asks Redis now (a PING), also during a back-off: /healthz says how Redis is, not how it
        was at the last call; an answer ends the back-off at once.
        """
        try:
            self.client().ping()
        except (redis.RedisError, OSError) as exc:
            self._failed("ping", exc)
            return f"unavailable ({self.errors} errors, last: {self.last_error}); {degraded}"
        self._answered()
        return "ok"
