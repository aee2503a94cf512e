"""Per-owner prompt rate limit: a sliding window of recent prompt times, in this process."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable

from django.conf import settings


class RateLimiter:
    """At most `limit` prompts per `window` seconds per key; 0 disables it.

    In-process on purpose: a limit that needs Redis would fail closed exactly when
    Redis is down. With several daphne processes a user may get up to `limit` per
    process (the balancer decides where each socket or request lands).
    Keys idle for a whole window are dropped once a window, so memory follows
    the users active in the last minute, not every visitor ever seen.
    """

    def __init__(
        self, limit: int, window: float = 60.0, clock: Callable[[], float] = time.monotonic
    ):
        self.limit = limit
        self.window = window
        self._clock = clock
        self._hits: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()
        self._pruned_at = clock()

    def check(self, key: str) -> float:
        """0.0 if allowed (and counted), else the seconds until the next prompt is allowed."""
        if self.limit <= 0:
            return 0.0
        now = self._clock()
        with self._lock:
            if now - self._pruned_at >= self.window:
                self._prune(now)
            hits = self._hits[key]
            while hits and now - hits[0] >= self.window:
                hits.popleft()
            if len(hits) >= self.limit:
                return self.window - (now - hits[0])
            hits.append(now)
            return 0.0

    def _prune(self, now: float) -> None:
        for key in [
            k for k, hits in self._hits.items() if not hits or now - hits[-1] >= self.window
        ]:
            del self._hits[key]
        self._pruned_at = now

    def __len__(self) -> int:
        return len(self._hits)


# One limit for every transport: WebSocket prompts and the HTTP API count together.
prompt_limiter = RateLimiter(settings.CHAT_RATE_LIMIT_PER_MINUTE)
