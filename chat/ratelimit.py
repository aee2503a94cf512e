"""Prompt rate limits: a sliding window of recent prompt times per owner and per address, in this process."""

from __future__ import annotations

import ipaddress
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
        return self._check(key, count=True)

    def wait(self, key: str) -> float:
        """What `check` would answer, counting nothing."""
        return self._check(key, count=False)

    def _check(self, key: str, *, count: bool) -> float:
        if self.limit <= 0:
            return 0.0
        now = self._clock()
        with self._lock:
            if now - self._pruned_at >= self.window:
                self._prune(now)
            hits = self._hits[key] if count else self._hits.get(key, deque())
            while hits and now - hits[0] >= self.window:
                hits.popleft()
            if len(hits) >= self.limit:
                return self.window - (now - hits[0])
            if count:
                hits.append(now)
            return 0.0

    def _prune(self, now: float) -> None:
        for key in [
            k for k, hits in self._hits.items() if not hits or now - hits[-1] >= self.window
        ]:
            del self._hits[key]
        self._pruned_at = now

    def clear(self) -> None:
        """Forget every window (tests start from none)."""
        with self._lock:
            self._hits.clear()

    def __len__(self) -> int:
        return len(self._hits)


def client_address(peer: str | None, forwarded_for: str | None) -> str | None:
    """The visitor's address as a rate-limit key: the peer, or X-Forwarded-For behind trusted proxies.

    With `CHAT_TRUSTED_PROXIES` = N > 0 the client is the N-th address from the right of
    X-Forwarded-For (each proxy appends the address it saw; anything left of that the client
    wrote itself). With 0 the header is ignored: anyone can send it. An IPv6 client counts by
    its /64, which one machine can fill with addresses.
    """
    proxies = settings.CHAT_TRUSTED_PROXIES
    if proxies > 0 and forwarded_for:
        hops = [hop.strip() for hop in forwarded_for.split(",")]
        if len(hops) >= proxies:
            peer = hops[-proxies]
    if not peer:
        return None
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return peer  # a unix socket path or a name: still one visitor
    if address.version == 6:
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


# One limit for every transport: WebSocket prompts and the HTTP API count together.
prompt_limiter = RateLimiter(settings.CHAT_RATE_LIMIT_PER_MINUTE)
# Visitors without an account also count per address: dropping the session cookie gains nothing.
address_limiter = RateLimiter(settings.CHAT_RATE_LIMIT_PER_ADDRESS)
