"""A running answer's numbered events in a Redis stream of its own, kept a while after it ends.

The turn keeps its events in memory too (chat/turns/journal.py), which is what a resume in the
same process reads; the stream is what outlives that memory: the last number of an answer that
ended, for the `done` a returning page gets. Writes leave the event loop through a worker
thread, one batch (a pipeline) at a time per answer, so a slow Redis delays no chunk; while
Redis is down nothing is written and the chat goes on.

Erasing an answer (its conversation or account deleted: chat/stores/erasure.py) deletes its
stream at once and leaves a marker that no later write of a turn still ending crosses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from django.conf import settings

from ..infra.redis_guard import RedisGuard

log = logging.getLogger(__name__)

KEY_PREFIX = "chat:answer-events:"
# Set (with a short expiry, renewed) while another process follows an answer's stream for a
# client that resumed there: the owning process then does not stop it for want of a listener.
LISTENING_PREFIX = "chat:answer-listening:"
LISTENING_MS = 3000
# How long an answer's stream is kept after its last event: long enough for a phone that
# wakes a tab, short enough that finished answers do not pile up.
STREAM_TTL_SECONDS = 15 * 60
# An answer's events reach its stream in batches at most this often: one Redis round trip (and
# one hop to a thread) per batch, not per token. A client resuming in another process is at
# most this far behind; this process's own clients read the journal in memory.
FLUSH_SECONDS = 0.05
# Left by an erasure, as long as a stream would live: a turn still ending writes nothing more.
ERASED_PREFIX = "chat:answer-erased:"

# One batch, atomic with the erasure's marker: skipped once the answer was erased. KEYS: the
# stream, the marker; ARGV: fresh (a first batch replaces the stream), ttl, then seq, event pairs.
_APPEND = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if ARGV[1] == '1' then redis.call('DEL', KEYS[1]) end
for i = 3, #ARGV, 2 do redis.call('XADD', KEYS[1], '0-' .. ARGV[i], 'event', ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""

_guard = RedisGuard(
    "answer event streams",
    url=lambda: settings.CHAT_CACHE_REDIS_URL,
    fallback="answers resume from this process's memory only",
)


def _key(message_id: int) -> str:
    return f"{KEY_PREFIX}{message_id}"


def stream_read(message_id: int, after: int = 0) -> list[dict]:
    """The events kept for `message_id` numbered above `after`, oldest first ([] without Redis)."""
    entries: Any = _guard.call(
        "read", lambda r: r.xrange(_key(message_id), min=f"0-{after + 1}", max="+")
    )[1]
    return [json.loads(fields[b"event"]) for _id, fields in entries or ()]


def stream_last(message_id: int) -> dict | None:
    """The last event kept for `message_id`, or None."""
    entries: Any = _guard.call("last", lambda r: r.xrevrange(_key(message_id), count=1))[1]
    return json.loads(entries[0][1][b"event"]) if entries else None


def stream_follow(message_id: int, after: int, block_ms: int = 300) -> list[dict] | None:
    """The events after `after`, waiting up to `block_ms` for one (under the client's 0.5 s
    timeout); says meanwhile that this process listens. None when Redis cannot be asked."""

    def follow(r):
        r.set(f"{LISTENING_PREFIX}{message_id}", 1, px=LISTENING_MS)
        return r.xread({_key(message_id): f"0-{after}"}, block=block_ms)

    answered, found = _guard.call("follow", follow)
    if not answered:
        return None
    entries: Any = found[0][1] if found else ()
    return [json.loads(fields[b"event"]) for _id, fields in entries]


def listening_elsewhere(message_id: int) -> bool:
    """Whether a process follows the answer's stream for a client (False without Redis)."""
    return bool(_guard.call("listening", lambda r: r.exists(f"{LISTENING_PREFIX}{message_id}"))[1])


def streams_erase(message_ids: list[int]) -> bool:
    """Delete the streams of erased answers now, and bar any later write to them; False when
    Redis could not be reached (they then expire within STREAM_TTL_SECONDS)."""

    def erase(r):
        pipe = r.pipeline(transaction=False)
        for message_id in message_ids:
            pipe.set(f"{ERASED_PREFIX}{message_id}", 1, ex=STREAM_TTL_SECONDS)
            pipe.delete(_key(message_id), f"{LISTENING_PREFIX}{message_id}")
        return pipe.execute()

    return not message_ids or _guard.call("erase", erase)[0]


class StreamWriter:
    """Appends one answer's events to its stream, in order, off the event loop.

    The stream's entry ids are `0-<seq>`, so a read from any number is a range. A new turn on
    the same message (a Continue) numbers from 1 again, so its first batch replaces the stream.
    """

    def __init__(self, message_id: int):
        self.key = _key(message_id)
        self.erased_key = f"{ERASED_PREFIX}{message_id}"
        self._pending: list[tuple[int, str]] = []
        self._flushing: asyncio.Task | None = None
        self._fresh = True
        self._urgent = asyncio.Event()

    def push(self, seq: int, payload: str, *, final: bool = False) -> None:
        """Append one event; the answer's last one (`final`) is written at once, with what
        waits before it, so a resume right after the end reads the end."""
        self._pending.append((seq, payload))
        if final:
            self._urgent.set()
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def drain(self) -> None:
        """Wait until every pushed event was handed to Redis (or Redis failed)."""
        while self._flushing is not None and not self._flushing.done():
            await asyncio.shield(self._flushing)

    async def _flush(self) -> None:
        while self._pending:
            if not self._fresh:  # the first batch (accepted) goes at once
                with contextlib.suppress(TimeoutError):  # not wait_for: see partial.py
                    async with asyncio.timeout(FLUSH_SECONDS):
                        await self._urgent.wait()
            batch, self._pending = self._pending, []
            fresh, self._fresh = self._fresh, False
            try:
                await asyncio.to_thread(self._write, batch, fresh)
            except Exception:  # the stream is a convenience; the answer goes on
                log.exception("could not write the events of %s", self.key)

    def _write(self, batch: list[tuple[int, str]], fresh: bool) -> None:
        events = [part for seq, payload in batch for part in (str(seq), payload)]
        _guard.call(
            "append",
            lambda r: r.eval(
                _APPEND,
                2,
                self.key,
                self.erased_key,
                "1" if fresh else "0",
                str(STREAM_TTL_SECONDS),
                *events,
            ),
        )
