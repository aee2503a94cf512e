"""One admission queue for an inference server shared by many processes, kept in Redis.

Every daphne process sends its streams to the same vLLM/TGI server, so "how many
streams may be open" and "who is next" are global questions. Tickets wait in one
FIFO (a ZSET scored by arrival order); at most `capacity` hold a slot at once. Each
ticket, waiting or running, carries a lease its process renews while it lives; a dead
process's tickets expire and stop blocking the rest. Positions are ranks in the global
queue, so a user is told the truth whichever process serves them.

All changes run as Lua scripts (atomic in Redis); every change that moves the queue
is published, so other processes promote their waiters and update positions at once.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import cast

import redis

log = logging.getLogger(__name__)

# One script for joining, renewing and admitting: purge expired leases, renew ours,
# then admit our waiters in order while global slots (and our own room) allow.
# KEYS: queue (zset, score = arrival), running (zset), leases (zset, score = expiry ms), seq, channel
# ARGV: lease_ms, capacity, room (how many of ours may start), join (1/0), ids (ours, oldest first)
# Time is Redis's own clock, so processes on machines whose clocks disagree still agree on leases.
# Returns one number per id: 0 = holds a slot, n >= 1 = waiting with n - 1 tickets ahead, -1 = unknown (expired).
_ADMIT = """
local queue, running, leases, seq, channel = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease, capacity, room, join = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local moved = false
for _, id in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now)) do
  redis.call('ZREM', queue, id); redis.call('ZREM', running, id); redis.call('ZREM', leases, id)
  moved = true
end
local result = {}
for i = 5, #ARGV do
  local id = ARGV[i]
  if join == '1' then
    redis.call('ZADD', queue, redis.call('INCR', seq), id)
    redis.call('ZADD', leases, now + lease, id)
  elseif redis.call('ZSCORE', leases, id) then
    redis.call('ZADD', leases, now + lease, id)
  end
  local rank = redis.call('ZRANK', queue, id)
  if rank then
    if room > 0 and rank < capacity - redis.call('ZCARD', running) then
      redis.call('ZREM', queue, id); redis.call('ZADD', running, now, id)
      room = room - 1; moved = true
      result[#result + 1] = 0
    else
      result[#result + 1] = rank + 1
    end
  elseif redis.call('ZSCORE', running, id) then
    result[#result + 1] = 0
  else
    result[#result + 1] = -1
  end
end
if moved then redis.call('PUBLISH', channel, 'moved') end
return result
"""

_RELEASE = """
local removed = redis.call('ZREM', KEYS[1], ARGV[1]) + redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if removed > 0 then redis.call('PUBLISH', KEYS[5], 'moved') end
return removed
"""


class RedisAdmission:
    """A global FIFO with `capacity` slots, shared through Redis by every process that names it alike.

    Args:
        url: the Redis holding the queue.
        name: the queue's name (one per inference server and model).
        capacity: streams open at once across all processes.
        lease_seconds: a ticket not renewed for this long is dropped (its process died).

    Any Redis failure surfaces as one of `errors`; the caller falls back.
    """

    errors = (redis.RedisError, OSError)

    def __init__(self, url: str, name: str, *, capacity: int, lease_seconds: float = 10.0):
        self.capacity = max(1, capacity)
        self.lease_ms = int(lease_seconds * 1000)
        self.client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=2)
        prefix = f"chat:admission:{name}"
        self.keys = [
            f"{prefix}:queue",
            f"{prefix}:running",
            f"{prefix}:leases",
            f"{prefix}:seq",
            f"{prefix}:moved",
        ]
        self._admit = self.client.register_script(_ADMIT)
        self._release = self.client.register_script(_RELEASE)
        self._pubsub: redis.client.PubSub | None = None

    @property
    def renew_seconds(self) -> float:
        """How often a live process must renew its leases: well inside one lease."""
        return self.lease_ms / 3000

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def join(self, ticket_id: str, *, room: int = 1) -> int:
        """Enter the queue; 0 if the ticket holds a slot at once, else its position (1 = next)."""
        return self._call(1, [ticket_id], room)[0]

    def admit(self, ticket_ids: list[str], *, room: int) -> list[int]:
        """Renew these tickets' leases and admit the ones whose turn it is (at most `room`); positions as in `join`."""
        return self._call(0, ticket_ids, room) if ticket_ids else []

    def release(self, ticket_id: str) -> None:
        """Leave the queue or give the slot back."""
        self._release(keys=self.keys, args=[ticket_id])

    def wait(self, timeout: float) -> None:
        """Block until the queue moves somewhere (a release or an admission), or `timeout` passes."""
        if self._pubsub is None:
            self._pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            self._pubsub.subscribe(self.keys[4])
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self._pubsub.get_message(timeout=left) is not None:
                while self._pubsub.get_message(timeout=0) is not None:
                    pass  # one wake-up for a burst
                return

    def counts(self) -> tuple[int, int]:
        """(running, waiting) across every process."""
        # redis-py types every command for its sync and async clients at once
        running = cast(int, self.client.zcard(self.keys[1]))
        waiting = cast(int, self.client.zcard(self.keys[0]))
        return int(running), int(waiting)

    def close(self) -> None:
        if self._pubsub is not None:
            self._pubsub.close()
        self.client.close()

    def _call(self, join: int, ids: list[str], room: int) -> list[int]:
        return [
            int(v)
            for v in self._admit(
                keys=self.keys, args=[self.lease_ms, self.capacity, room, join, *ids]
            )
        ]
