"""The generations in flight in every process, kept in Redis: who owns one, who listens, its events.

One generation, named by an id derived from its answer identity and token ids, has three keys:

- `owner`: the owning process's token, with a lease (PX) the owner renews each time it
  publishes and at least every `renew_seconds`; a dead owner's key expires by itself.
- `listeners`: a ZSET of the other processes following it, scored by their lease's expiry
  (Redis's clock); a listener renews while it follows, and an expired one no longer counts.
- `events`: a Redis stream of the generation's events in order, each with its sequence
  number `n`, so a joiner replays it from the start and then blocks for the live ones, and a
  gap (a trimmed or restarted stream) is seen instead of skipped.

Every change that must be atomic (claim or join, publish and renew, abandon) is a Lua
script; time is Redis's own clock, as in admission.py. Redis failures surface as `errors`;
the caller falls back to generating in its own process.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any, cast

import redis

PREFIX = "chat:generation:"

# KEYS: owner, listeners, events. ARGV: owner token, lease_ms, listener id.
# 1 = the caller now owns the generation (an old stream is dropped), 0 = it joined as a listener.
_CLAIM = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease = tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('ZADD', KEYS[2], now + lease, ARGV[3])
  redis.call('PEXPIRE', KEYS[2], lease * 3)
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('SET', KEYS[1], ARGV[1], 'PX', lease)
return 1
"""

# KEYS: owner, listeners, events. ARGV: token, lease_ms, maxlen, events_ttl_ms, final (1/0), payloads...
# Appends the events, renews (or, with final, gives up) the ownership; returns the listeners
# whose lease still runs, or -1 if the ownership was lost (the lease ran out), then nothing is added.
_PUBLISH = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
for i = 6, #ARGV do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[i])
end
redis.call('PEXPIRE', KEYS[3], ARGV[4])
if ARGV[5] == '1' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return redis.call('ZCARD', KEYS[2])
"""

# KEYS: owner, listeners. ARGV: token. Gives the generation up only if no listener's lease runs:
# 1 = given up (nobody may join it any more), 0 = someone still listens.
_ABANDON = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZCARD', KEYS[2]) > 0 then return 0 end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""

# KEYS: owner, listeners. ARGV: listener id, lease_ms. Renews the listener; 1 if an owner still holds it.
_RENEW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[2], lease * 3)
return redis.call('EXISTS', KEYS[1])
"""


def generation_id(key: str, input_ids: list[int]) -> str:
    """The name of a generation: its answer identity and its token ids (a re-ask has the same identity)."""
    ids = hashlib.sha256(json.dumps(input_ids, separators=(",", ":")).encode()).hexdigest()
    return f"{key}:{ids[:32]}"


class GenerationRegistry:
    """Ownership, listeners and events of the generations in flight, shared by every process on one Redis.

    Args:
        url: the Redis (the completion cache's: coalescing is the cache's in-flight twin).
        lease_seconds: an owner or listener not heard from for this long is gone.
        max_events: a stream keeps at most about this many events (XADD MAXLEN ~); more than
            any generation sends, so a joiner always finds the first one.
        events_ttl_seconds: how long a finished generation's events stay readable for
            listeners still replaying them.
    """

    errors = (redis.RedisError, OSError)

    def __init__(
        self,
        url: str,
        *,
        lease_seconds: float = 10.0,
        max_events: int = 20_000,
        events_ttl_seconds: float = 60.0,
    ):
        self.lease_ms = max(1, int(lease_seconds * 1000))
        self.max_events = max_events
        self.events_ttl_ms = max(self.lease_ms * 3, int(events_ttl_seconds * 1000))
        # Claims and cancels run on the server's event loop: a Redis that hangs must not hold it.
        self.client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        # Blocking reads wait up to `renew_seconds` on their own connection pool.
        self.reader = redis.Redis.from_url(
            url, socket_connect_timeout=0.5, socket_timeout=self.renew_seconds + 5
        )
        self._claim = self.client.register_script(_CLAIM)
        self._publish = self.client.register_script(_PUBLISH)
        self._abandon = self.client.register_script(_ABANDON)
        self._renew = self.client.register_script(_RENEW)

    @property
    def renew_seconds(self) -> float:
        """How often an owner or listener renews its lease: well inside one lease."""
        return self.lease_ms / 3000

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    @staticmethod
    def _keys(generation: str) -> list[str]:
        base = PREFIX + generation
        return [f"{base}:owner", f"{base}:listeners", f"{base}:events"]

    def claim(self, generation: str, token: str, listener: str) -> bool:
        """Own `generation` (True) if nobody does, else join it as `listener` (False)."""
        keys = self._keys(generation)
        return bool(int(self._claim(keys=keys, args=[token, self.lease_ms, listener])))

    def publish(
        self, generation: str, token: str, events: list[dict[str, Any]], *, final: bool = False
    ) -> int:
        """Append `events` (each already carrying its `n`) and renew the ownership, or give it up
        with `final`; the live listeners, or -1 when this owner's lease was lost."""
        payloads = [json.dumps(event, separators=(",", ":")) for event in events]
        args: list[str | int] = [
            token,
            self.lease_ms,
            self.max_events,
            self.events_ttl_ms,
            int(final),
            *payloads,
        ]
        return int(self._publish(keys=self._keys(generation), args=args))

    def abandon(self, generation: str, token: str) -> bool:
        """Give the generation up if no listener remains (True: it may be stopped)."""
        return bool(int(self._abandon(keys=self._keys(generation)[:2], args=[token])))

    def renew(self, generation: str, listener: str) -> bool:
        """Renew `listener`'s lease; False once no owner holds the generation (finished or dead)."""
        keys = self._keys(generation)[:2]
        return bool(int(self._renew(keys=keys, args=[listener, self.lease_ms])))

    def leave(self, generation: str, listener: str) -> None:
        self.client.zrem(self._keys(generation)[1], listener)

    def listeners(self, generation: str) -> int:
        """Listeners registered now, expired or not (tests)."""
        return int(cast(int, self.client.zcard(self._keys(generation)[1])))

    def read(
        self, generation: str, after: str = "0", block_seconds: float | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """Events after stream id `after` ("0": from the start), oldest first; with
        `block_seconds`, waits that long for the first one."""
        key = self._keys(generation)[2]
        block = None if block_seconds is None else max(1, int(block_seconds * 1000))
        client = self.reader if block is not None else self.client
        answer = cast(list[Any], client.xread({key: after}, count=512, block=block))
        if not answer:
            return []
        _, entries = answer[0]
        return [(_text(entry_id), json.loads(fields[b"e"])) for entry_id, fields in entries]

    def close(self) -> None:
        self.client.close()
        self.reader.close()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
