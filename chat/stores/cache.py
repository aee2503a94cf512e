"""The completion cache in Redis: store, serve, evict; chat goes on without it.

Entries are keyed by the answer's identity (chat/turns/identity.py).

An answer is cached whole, after it ended normally and passed its policy; a
stream is never cached as a stream. When Redis is unreachable, calls return
"miss" at once for a short back-off instead of making every turn wait for a
timeout, and caching resumes by itself when Redis answers again.
"""

from __future__ import annotations

import json
import logging

from django.conf import settings

from ..infra import metrics
from ..infra.redis_guard import RedisGuard

log = logging.getLogger(__name__)

KEY_PREFIX = "chat:answer:"
CACHEABLE_FINISH = ("eos", "stop_string")


class CompletionCache:
    """JSON entries with a TTL in Redis; while Redis is down the chat goes on uncached."""

    def __init__(self):
        self._guard = RedisGuard(
            "completion cache",
            url=lambda: settings.CHAT_CACHE_REDIS_URL,
            fallback="chat continues uncached",
            on_error=lambda operation: metrics.CACHE_ERRORS.labels(operation).inc(),
        )

    @property
    def backoff_seconds(self) -> float:
        return self._guard.backoff_seconds

    @backoff_seconds.setter
    def backoff_seconds(self, seconds: float) -> None:
        self._guard.backoff_seconds = seconds

    def _call(self, operation: str, fn):
        return self._guard.call(operation, fn)[1]

    def get(self, key: str) -> dict | None:
        raw = self._call("get", lambda r: r.get(KEY_PREFIX + key))
        return json.loads(raw) if raw else None

    def put(self, key: str, entry: dict, ttl_seconds: int) -> bool:
        payload = json.dumps(entry, ensure_ascii=False)
        return bool(
            self._call("put", lambda r: r.set(KEY_PREFIX + key, payload, ex=max(1, ttl_seconds)))
        )

    def evict(self, key: str) -> bool:
        return bool(self._call("evict", lambda r: r.delete(KEY_PREFIX + key)))

    def remove(self, *keys: str) -> bool:
        """Delete `keys`: True once Redis answered (they are gone, whether or not they were
        there), False if Redis could not be asked. Unlike `evict`, False means "try again"."""
        names = [KEY_PREFIX + key for key in keys]
        answered, _ = self._guard.call("evict", lambda r: r.delete(*names))
        return answered

    def status(self) -> str:
        return self._guard.status("serving uncached")


completion_cache = CompletionCache()
