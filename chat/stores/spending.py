"""What each budget has spent this UTC day and month, counted in Redis for every process at once.

One counter per scope (a user or a key), period and kind (tokens, answers):
`chat:budget:<user|key>:<id>:<d20261205|m202612>:<tokens|answers>`. The `Usage` rows in the
database (budgets.py) are the record; a counter is a copy of their sum that every answer's charge
increments atomically (one Lua script for all its counters), so processes sharing Redis see one
total. A counter is seeded from the database when it is missing and expires after
`REFRESH_SECONDS` (or at its period's end, if sooner), so it is reconciled with the record at
least that often, whatever it missed.

Without Redis: a check sums the database instead (slower, as exact as the record); a charge is
in the database anyway, and the counters it missed are dropped once Redis answers again, to be
seeded afresh. Nothing is lost and nobody is locked out.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

from django.conf import settings

from ..infra import metrics
from ..infra.redis_guard import RedisGuard
from .budgets import Period, Scope, spent_in_database

log = logging.getLogger(__name__)

KEY_PREFIX = "chat:budget:"
KINDS = ("tokens", "answers")
# How long a counter may go without being reconciled with the database.
REFRESH_SECONDS = 600

# Atomic across processes: every counter of one answer incremented together, and only counters
# that exist (a missing one is seeded from the database, which already holds this charge).
_CHARGE = """
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('INCRBY', key, ARGV[i])
  end
end
return #KEYS
"""


def counter_key(scope: Scope, period: Period, kind: str) -> str:
    return f"{KEY_PREFIX}{scope.name}:{period.name}:{kind}"


def _ttl(period: Period) -> int:
    left = (period.resets_at - datetime.now(UTC)).total_seconds()
    return max(1, min(REFRESH_SECONDS, int(left) + 1))


class SpendingCounters:
    def __init__(self):
        self._guard = RedisGuard(
            "budget counters",
            url=lambda: settings.REDIS_URL,
            fallback="budgets are checked against the database",
            on_error=lambda operation: metrics.BUDGET_REDIS_ERRORS.labels(operation).inc(),
        )
        self._script = None
        self._missed: set[str] = set()  # counters a charge could not reach: dropped when back
        self._lock = threading.Lock()

    @property
    def backoff_seconds(self) -> float:
        return self._guard.backoff_seconds

    @backoff_seconds.setter
    def backoff_seconds(self, seconds: float) -> None:
        self._guard.backoff_seconds = seconds

    def spent(self, scopes: list[Scope], periods: list[Period]) -> dict[tuple, int]:
        """{(scope, period span, kind): spent} for every pair: from Redis, or the database."""
        wanted = [(s, p, k) for s in scopes for p in periods for k in KINDS]
        keys = [counter_key(s, p, k) for s, p, k in wanted]
        with self._lock:
            missed = list(self._missed)

        def read(client):
            if missed:
                client.delete(*missed)
            return client.mget(keys)

        ok, values = self._guard.call("read", read)
        if ok and missed:
            with self._lock:
                self._missed.difference_update(missed)
        answer: dict[tuple, int] = {}
        from_database: dict[tuple[Scope, str], dict[str, int]] = {}
        seeds = {}
        for index, (scope, period, kind) in enumerate(wanted):
            value = values[index] if ok and values is not None else None
            if value is None:
                if (scope, period.name) not in from_database:
                    from_database[(scope, period.name)] = spent_in_database(scope, period)
                number = from_database[(scope, period.name)][kind]
                if ok:
                    seeds[keys[index]] = (number, _ttl(period))
            else:
                number = int(value)
            answer[(scope, period.span, kind)] = number
        if seeds:
            self._seed(seeds)
        return answer

    def _seed(self, seeds: dict[str, tuple[int, int]]) -> None:
        def write(client):
            pipe = client.pipeline(transaction=False)
            for key, (value, ttl) in seeds.items():
                pipe.set(key, value, nx=True, ex=ttl)  # a charge or seed already there wins
            pipe.execute()

        self._guard.call("seed", write)

    def charge(self, scopes: list[Scope], periods: list[Period], *, tokens: int, answers: int):
        """Add one answer to every counter it counts against; True if Redis took it."""
        amounts = {"tokens": tokens, "answers": answers}
        keys, args = [], []
        for scope in scopes:
            for period in periods:
                for kind in KINDS:
                    if amounts[kind]:
                        keys.append(counter_key(scope, period, kind))
                        args.append(amounts[kind])
        if not keys:
            return True
        ok, _ = self._guard.call(
            "charge", lambda client: self._charge(client)(keys=keys, args=args)
        )
        if not ok:
            with self._lock:
                self._missed.update(keys)
        return ok

    def _charge(self, client):
        if self._script is None or self._script.registered_client is not client:
            self._script = client.register_script(_CHARGE)
        return self._script

    def status(self) -> str:
        return self._guard.status("checked against the database")

    def clear(self) -> None:
        """Drop every counter (tests; `manage.py budget reconcile`): each is seeded afresh."""
        with self._lock:
            self._missed.clear()
        self._guard.call(
            "clear",
            lambda client: [client.delete(k) for k in client.scan_iter(f"{KEY_PREFIX}*")],
        )


spending = SpendingCounters()
