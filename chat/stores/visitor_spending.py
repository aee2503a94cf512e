"""What visitors without an account have spent: the tokens generated for them in a sliding window,
per session and per client address (CHAT_RATE_LIMITS' `visitor_tokens` and
`visitor_address_tokens`), counted in Redis for every process.

Users' budgets are rows in the database, checked against their `Usage` rows; a visitor has no
row to hang either on, and their sessions are thrown away, so a visitor's budget is a setting
and Redis is its only record: one sorted set per key, a member per answer (its tokens in the
member, its time as the score), summed over the window. While Redis is unreachable each process
counts on its own, as the rate limits do: an outage neither refuses every visitor nor lets them
spend without a limit.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass

from django.conf import settings

from ..infra.redis_guard import RedisGuard

KEY_PREFIX = "chat:visitor-spent:"


@dataclass(frozen=True)
class Allowance:
    """One visitor limit now: what it allows, what its window holds, and when it frees up."""

    name: str  # the CHAT_RATE_LIMITS key: "visitor_tokens" or "visitor_address_tokens"
    limit: int
    spent: int
    frees_in: float  # seconds until what is spent drops below the limit (0: it is below)

    @property
    def left(self) -> int:
        return max(0, self.limit - self.spent)


class VisitorSpending:
    """Tokens per key in one sliding window, sized by CHAT_RATE_LIMITS[`name`] at each call (0
    turns it off)."""

    def __init__(self, name: str):
        self.name = name
        self._guard = RedisGuard(
            f"visitor budget {name!r}",
            url=lambda: settings.REDIS_URL,
            fallback="each process counts on its own",
        )
        self._local: dict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self._lock = threading.Lock()

    @property
    def limit(self) -> int:
        return settings.CHAT_RATE_LIMITS[self.name][0]

    @property
    def window(self) -> float:
        return settings.CHAT_RATE_LIMITS[self.name][1]

    def allowance(self, key: str) -> Allowance | None:
        """What `key` has spent against this limit; None when the limit is off."""
        limit, window = self.limit, self.window
        if limit <= 0:
            return None
        now = time.time()
        hits = self._hits(key, now, window)
        spent = sum(tokens for _, tokens in hits)
        frees_in, over = 0.0, spent
        for at, tokens in hits:  # oldest first: the window frees up as they leave it
            if over < limit:
                break
            over -= tokens
            frees_in = at + window - now
        return Allowance(self.name, limit, spent, max(0.0, frees_in))

    def charge(self, key: str, tokens: int) -> None:
        """Add one answer's tokens to `key`'s window."""
        if tokens <= 0 or self.limit <= 0:
            return
        now, window = time.time(), self.window
        member = f"{secrets.token_hex(8)}:{tokens}"

        def add(client):
            pipe = client.pipeline()
            pipe.zadd(self._key(key), {member: now})
            pipe.pexpire(self._key(key), int(window * 1000) + 1)
            pipe.execute()

        ok, _ = self._guard.call("charge", add)
        if not ok:
            with self._lock:
                self._local[key].append((now, tokens))

    def _hits(self, key: str, now: float, window: float) -> list[tuple[float, int]]:
        def read(client):
            pipe = client.pipeline()
            pipe.zremrangebyscore(self._key(key), "-inf", now - window)
            pipe.zrange(self._key(key), 0, -1, withscores=True)
            return pipe.execute()[1]

        ok, rows = self._guard.call("read", read)
        if ok:
            return [(float(at), int(member.rsplit(b":", 1)[1])) for member, at in rows or []]
        with self._lock:
            hits = self._local.get(key, deque())
            while hits and hits[0][0] <= now - window:
                hits.popleft()
            if not hits:
                self._local.pop(key, None)
            return list(hits)

    def _key(self, key: str) -> str:
        return f"{KEY_PREFIX}{self.name}:{key}"

    def clear(self) -> None:
        """Forget every window, shared and local (tests start from none)."""
        with self._lock:
            self._local.clear()
        self._guard.call(
            "clear",
            lambda client: [
                client.delete(k) for k in client.scan_iter(f"{KEY_PREFIX}{self.name}:*")
            ],
        )


# A budget per visitor session, and one per client address (a new session cookie is free).
session_spending = VisitorSpending("visitor_tokens")
address_spending = VisitorSpending("visitor_address_tokens")
ALL = (session_spending, address_spending)
