"""The generations in flight in every process, kept in Redis: who owns one, who listens, its events.

One generation, named by an id derived from its answer identity and token ids, has three keys:

- `owner`: the owning process's token, with a lease (PX) the owner renews each time it
  publishes and at least every `renew_seconds`; a dead owner's key expires by itself.
- `listeners`: a ZSET of the other processes following it, scored by their lease's expiry
  (Redis's clock); a listener renews while it follows, and an expired one no longer counts.
- `events`: a Redis stream of the generation's events in order, each with its sequence
  number `n`, so a joiner replays it from the start and then blocks for the live ones, and a
  gap (a trimmed or restarted stream) is seen instead of skipped.
- `tags`: a SET of the tags (`GenerationRequest.tag`, opaque: the chat's conversations) of the
  requests that claimed or joined it; and for each tag, `tag:<tag>`, a SET of its generations.
  Both are kept a day (`FILING_SECONDS`; renewed while it runs), long after the events expire.

`forget(tag)` is how a deleted conversation's answers leave Redis: the tag leaves each of its
generations' `tags`, and a generation no other tag holds any more loses all four keys, its
events first of all (a running owner then finds its lease gone and stops publishing). One still
held by another tag stays: its events are that other conversation's answer as much, the same
prompt's, and deleting them would break an answer someone else is still reading.

Every change that must be atomic (claim or join, publish and renew, abandon, forget) is a Lua
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
FILING_SECONDS = 24 * 3600  # how long a generation stays filed under its tags, at least

# KEYS[4] a generation's tags, KEYS[5] the caller's tag's generations. `file` puts the
# generation under the tag (none when empty); `keep` only renews both for ttl ms, so a tag that
# was forgotten meanwhile is never filed again by a publish or a renewal.
_FILING = """
local function keep(ttl)
  redis.call('PEXPIRE', KEYS[4], ttl)
  redis.call('PEXPIRE', KEYS[5], ttl)
end
local function file(tag, generation, ttl)
  if tag == '' then return end
  redis.call('SADD', KEYS[4], tag)
  redis.call('SADD', KEYS[5], generation)
  keep(ttl)
end
"""

# KEYS: owner, listeners, events, tags, tag index. ARGV: owner token, lease_ms, listener id, tag,
# tags_ttl_ms, generation. 1 = the caller now owns the generation (an old stream is dropped),
# 0 = it joined as a listener.
_CLAIM = (
    _FILING
    + """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease = tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('ZADD', KEYS[2], now + lease, ARGV[3])
  redis.call('PEXPIRE', KEYS[2], lease * 3)
  file(ARGV[4], ARGV[6], ARGV[5])
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
redis.call('SET', KEYS[1], ARGV[1], 'PX', lease)
file(ARGV[4], ARGV[6], ARGV[5])
return 1
"""
)

# KEYS: owner, listeners, events, tags, tag index. ARGV: token, lease_ms, maxlen, events_ttl_ms,
# final (1/0), tags_ttl_ms, payloads... Appends the events, renews (or, with final, gives up)
# the ownership and keeps the filing longer than the events; returns the listeners whose lease
# still runs, or -1 if the ownership was lost (the lease ran out, or the generation was
# forgotten), then nothing is added.
_PUBLISH = (
    _FILING
    + """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
for i = 7, #ARGV do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[i])
end
redis.call('PEXPIRE', KEYS[3], ARGV[4])
if ARGV[5] == '1' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
keep(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return redis.call('ZCARD', KEYS[2])
"""
)

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

# KEYS: owner, listeners, events, tags, tag index. ARGV: listener id, lease_ms, tags_ttl_ms.
# Renews the listener and the filing; 1 if an owner still holds it.
_RENEW = (
    _FILING
    + """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[2], lease * 3)
keep(ARGV[3])
return redis.call('EXISTS', KEYS[1])
"""
)

# KEYS: owner, listeners, events, tags. ARGV: tag. The tag leaves the generation; if it held it
# and no other tag does, every key of the generation goes. 1 = the generation went.
_FORGET = """
if redis.call('SREM', KEYS[4], ARGV[1]) == 1 and redis.call('SCARD', KEYS[4]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
  return 1
end
return 0
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
        # The filing under tags is kept far longer than any generation and its events (renewed
        # while it runs), so a listener that left early is still found by `forget`.
        self.tags_ttl_ms = max(self.events_ttl_ms + self.lease_ms, FILING_SECONDS * 1000)
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
        self._forget = self.client.register_script(_FORGET)

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
        return [f"{base}:owner", f"{base}:listeners", f"{base}:events", f"{base}:tags"]

    @staticmethod
    def _tag_key(tag: str) -> str:
        return f"{PREFIX}tag:{tag}"

    def claim(self, generation: str, token: str, listener: str, tag: str = "") -> bool:
        """Own `generation` (True) if nobody does, else join it as `listener` (False); either
        way it is filed under `tag` (none when empty)."""
        keys = [*self._keys(generation), self._tag_key(tag)]
        args: list[str | int] = [token, self.lease_ms, listener, tag, self.tags_ttl_ms, generation]
        return bool(int(self._claim(keys=keys, args=args)))

    def publish(
        self,
        generation: str,
        token: str,
        events: list[dict[str, Any]],
        *,
        final: bool = False,
        tag: str = "",
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
            self.tags_ttl_ms,
            *payloads,
        ]
        keys = [*self._keys(generation), self._tag_key(tag)]
        return int(self._publish(keys=keys, args=args))

    def abandon(self, generation: str, token: str) -> bool:
        """Give the generation up if no listener remains (True: it may be stopped)."""
        return bool(int(self._abandon(keys=self._keys(generation)[:2], args=[token])))

    def renew(self, generation: str, listener: str, tag: str = "") -> bool:
        """Renew `listener`'s lease (and its filing under `tag`); False once no owner holds the
        generation (finished or dead)."""
        keys = [*self._keys(generation), self._tag_key(tag)]
        args: list[str | int] = [listener, self.lease_ms, self.tags_ttl_ms]
        return bool(int(self._renew(keys=keys, args=args)))

    def forget(self, tag: str) -> int:
        """Take `tag` off every generation filed under it; those no other tag holds lose their
        events, owner and listeners. How many generations went."""
        if not tag:
            return 0
        index = self._tag_key(tag)
        gone = 0
        for generation in cast(set[bytes], self.client.smembers(index)):
            keys = self._keys(_text(generation))
            gone += int(self._forget(keys=keys, args=[tag]))
        self.client.delete(index)
        return gone

    def tags(self, generation: str) -> set[str]:
        """The tags a generation is filed under (tests)."""
        return {
            _text(tag) for tag in cast(set[bytes], self.client.smembers(self._keys(generation)[3]))
        }

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
