"""Every throttle, one mechanism: a sliding window of recent hits per key, counted in Redis.

Prompts (per owner and per visitor address), resumes and ratings per owner, sign-ups per
address and failed sign-ins per account and per address are all a SharedRateLimiter, sized by
CHAT_RATE_LIMITS. Counted in Redis, so every server process shares one window per key (N
processes behind a balancer do not allow N times the limit); while Redis is unreachable each process counts on its own, says so in /healthz,
and goes back to the shared count when Redis answers again: an outage neither locks everyone
out nor lets everyone through.
"""

from __future__ import annotations

import ipaddress
import secrets
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import cast

from django.conf import settings

from .redis_guard import RedisGuard

# One round trip, atomic: drop hits older than the window, refuse when full (answering how
# long until the oldest hit leaves it), else record this hit when asked to.
_SLIDING_WINDOW = """
local now, window, limit, count = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= limit then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return tostring(tonumber(oldest[2]) + window - now)
end
if count == '1' then
  redis.call('ZADD', KEYS[1], now, ARGV[5])
  redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000))
end
return '0'
"""


class RateLimiter:
    """At most `limit` prompts per `window` seconds per key, in this process; 0 disables it.

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

    def reset(self, key: str) -> None:
        with self._lock:
            self._hits.pop(key, None)

    def clear(self) -> None:
        """Forget every window (tests start from none)."""
        with self._lock:
            self._hits.clear()

    def __len__(self) -> int:
        return len(self._hits)


def client_peer(peer: str | None, forwarded_for: str | None) -> str | None:
    """The client's own address: the peer, or the N-th entry from the right of X-Forwarded-For
    behind `CHAT_TRUSTED_PROXIES` = N proxies (anything left of it the client wrote itself)."""
    proxies = settings.CHAT_TRUSTED_PROXIES
    if proxies > 0 and forwarded_for:
        hops = [hop.strip() for hop in forwarded_for.split(",")]
        if len(hops) >= proxies:
            return hops[-proxies]
    return peer


def client_address(peer: str | None, forwarded_for: str | None) -> str | None:
    """The visitor's address as a rate-limit key: the peer, or X-Forwarded-For behind trusted proxies.

    With `CHAT_TRUSTED_PROXIES` = N > 0 the client is the N-th address from the right of
    X-Forwarded-For (each proxy appends the address it saw; anything left of that the client
    wrote itself). With 0 the header is ignored: anyone can send it. An IPv6 client counts by
    its /64, which one machine can fill with addresses.
    """
    peer = client_peer(peer, forwarded_for)
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


class SharedRateLimiter:
    """The same limit counted in Redis for every process, with this process's RateLimiter as the
    fallback while Redis is unreachable (a limit that needs Redis must not refuse everyone when
    it is down, nor let everyone through)."""

    def __init__(self, name: str, limit: int, window: float = 60.0):
        self.name = name
        self.limit = limit
        self.window = window
        self.local = RateLimiter(limit, window)
        self._guard = RedisGuard(
            f"shared rate limit {name!r}",
            url=lambda: settings.REDIS_URL,
            fallback="each process counts on its own",
        )
        self._script = None

    def check(self, key: str) -> float:
        """0.0 if allowed (and counted), else the seconds until the next prompt is allowed."""
        return self._check(key, count=True)

    def wait(self, key: str) -> float:
        """What `check` would answer, counting nothing."""
        return self._check(key, count=False)

    def _check(self, key: str, *, count: bool) -> float:
        if self.limit <= 0:
            return 0.0
        hit = secrets.token_hex(8)  # a member per hit, so hits at equal times all count
        ok, wait = self._guard.call(
            "check",
            lambda client: self._sliding_window(client)(
                keys=[f"chat:rate:{self.name}:{key}"],
                args=[time.time(), self.window, self.limit, "1" if count else "0", hit],
            ),
        )
        if not ok:
            self.local.limit, self.local.window = self.limit, self.window
            return self.local.check(key) if count else self.local.wait(key)
        return float(cast(float, wait))  # the script's answer when `ok`

    def _sliding_window(self, client):
        if self._script is None or self._script.registered_client is not client:
            self._script = client.register_script(_SLIDING_WINDOW)
        return self._script

    def reset(self, key: str) -> None:
        """Forget `key`'s hits (a right password clears its account's failures)."""
        self.local.reset(key)
        self._guard.call("reset", lambda client: client.delete(f"chat:rate:{self.name}:{key}"))

    @property
    def per(self) -> str:
        """The window in words: "a minute", "an hour", "15 minutes"."""
        return span(self.window)

    def status(self) -> str:
        return self._guard.status("counted per process")

    def clear(self) -> None:
        """Forget every window, shared and local (tests start from none)."""
        self.local.clear()
        self._guard.call(
            "clear",
            lambda client: [client.delete(k) for k in client.scan_iter(f"chat:rate:{self.name}:*")],
        )


def span(seconds: float) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{'an' if unit == 'hour' else 'a'} {unit}" if n == 1 else f"{n} {unit}s"
    return f"{seconds:g} seconds"


def limiter(name: str, rate: str) -> SharedRateLimiter:
    """The limiter `name` sized by CHAT_RATE_LIMITS' `rate` (count, window seconds)."""
    limit, window = settings.CHAT_RATE_LIMITS[rate]
    return SharedRateLimiter(name, limit, window)


def connection_limiter(rate: str) -> RateLimiter:
    """A limit of one connection's own, sized by CHAT_RATE_LIMITS' `rate`: counted in this
    process, where the connection lives, and gone with it."""
    limit, window = settings.CHAT_RATE_LIMITS[rate]
    return RateLimiter(limit, window)


# One limit for every transport: WebSocket prompts and the HTTP API count together.
prompt_limiter = limiter("prompt", "prompt")
# Visitors without an account also count per address: dropping the session cookie gains nothing.
address_limiter = limiter("address", "prompt_address")
# Ratings (and taking them back) per account or visitor session (transports/feedback_api.py).
feedback_limiter = limiter("feedback", "feedback")
# Accounts made per address: each account has its own prompt limit (signup_throttle.py).
signup_limiter = limiter("signup", "signup_address")
# Failed sign-ins per account and per address (signin_throttle.py).
signin_account_limiter = limiter("signin-account", "signin_account")
signin_address_limiter = limiter("signin-address", "signin_address")
# Resumes per owner, over every socket and Last-Event-ID (and per socket: connection_limiter).
resume_limiter = limiter("resume", "resume")
ALL = (
    prompt_limiter,
    address_limiter,
    feedback_limiter,
    signup_limiter,
    signin_account_limiter,
    signin_address_limiter,
    resume_limiter,
)
