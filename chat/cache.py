"""The completion cache in Redis: key, store, serve, evict; chat goes on without it.

An answer is cached whole, after it ended normally and passed its policy; a
stream is never cached as a stream. When Redis is unreachable, calls return
"miss" at once for a short back-off instead of making every turn wait for a
timeout, and caching resumes by itself when Redis answers again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass

import redis
from django.conf import settings

from . import metrics

log = logging.getLogger(__name__)

KEY_PREFIX = "chat:answer:"
CACHEABLE_FINISH = ("eos", "stop_string")


def cache_key(
    *,
    model_id: str,
    fingerprint: str,
    rendered_prompt: str,
    params: dict,
    policy_slug: str,
    policy_version: int,
) -> str:
    """sha256 of a canonical JSON of everything that shapes the answer."""
    canonical = json.dumps(
        {
            "model": [model_id, fingerprint],
            "prompt": rendered_prompt,
            "params": params,
            "policy": [policy_slug, policy_version],
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class CacheState:
    available: bool = True
    errors: int = 0
    last_error: str = ""
    retry_at: float = 0.0


class CompletionCache:
    """A thin layer over redis-py: JSON entries with a TTL, and a back-off when Redis is down."""

    backoff_seconds = 2.0

    def __init__(self):
        self.state = CacheState()
        self._lock = threading.Lock()
        self._clients: dict[str, redis.Redis] = {}

    def _client(self) -> redis.Redis:
        url = settings.CHAT_CACHE_REDIS_URL
        with self._lock:
            if url not in self._clients:
                self._clients[url] = redis.Redis.from_url(
                    url, socket_timeout=0.5, socket_connect_timeout=0.5, health_check_interval=10
                )
            return self._clients[url]

    def _call(self, operation: str, fn):
        if not self.state.available and time.monotonic() < self.state.retry_at:
            return None
        try:
            value = fn(self._client())
        except (redis.RedisError, OSError) as exc:
            self.state.errors += 1
            self.state.last_error = f"{type(exc).__name__}: {exc}"
            if self.state.available:
                log.warning(
                    "completion cache unavailable (%s); chat continues uncached",
                    self.state.last_error,
                )
            self.state.available = False
            self.state.retry_at = time.monotonic() + self.backoff_seconds
            metrics.CACHE_ERRORS.labels(operation).inc()
            return None
        if not self.state.available:
            log.info("completion cache is back")
            self.state.available = True
        return value

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

    def status(self) -> str:
        if self.state.available:
            return "ok"
        return f"unavailable ({self.state.errors} errors, last: {self.state.last_error}); serving uncached"


completion_cache = CompletionCache()
