"""A running answer's text saved as it grows, so a crash keeps what the user already read.

At least every `every_s` seconds or every `every_chunks` chunks, whichever comes first, the text
so far is written to the answer's message. Every running answer of the process is saved together:
one task on the event loop gathers the texts that changed since the last save and hands them to
one worker thread, which writes them in one go. The decode step never waits on the
database, and a write still under way when a text grows again is not queued behind: the next
write simply takes the newest text (writes coalesce). Only a message still `streaming` is
written, so a late write can never undo the answer's final store (chat/stores/storage.py); after
a crash, the start-up sweep (chat/stores/recovery.py) marks it interrupted and keeps that text.

Why together: with eight answers relayed at a token rate people read at, a save of its own for
each answer (a timer, a trip to the thread and back) cost the web process about a quarter of its
CPU per relayed token; one trip for all of them costs a fraction of it (docs/engine.md, the
relay).

The thread keeps its database connection while any answer is saving and closes it when the last
one ends: under CONN_MAX_AGE=0 a connection opened and closed for every save (two a second for
each answer running) was about a fifth of the web process's CPU while relaying answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, connection
from django.utils import timezone

from ..models import Message

log = logging.getLogger(__name__)

# At least this often, or this many chunks (about one token each), whichever comes first. Half
# a second, not the one the product promises: a write under way when the server dies is lost,
# so the text shown more than a second before a crash is kept even if the last write was cut.
SAVE_EVERY_SECONDS = 0.5
SAVE_EVERY_CHUNKS = 64

# One thread for every answer's saves: one database connection, and the event loop never blocks.
_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chat-partial-save")


@functools.cache
def _update_sql() -> str:
    """The one UPDATE a partial save runs, spelt from the model's own names. Plain SQL, not
    QuerySet.update: the ORM compiled the same statement anew for every save, the largest
    single cost of a relayed answer (a save every half second for each answer running)."""
    meta, quote = Message._meta, connection.ops.quote_name
    column = {name: quote(meta.get_field(name).column) for name in ("text", "updated_at", "status")}
    return (
        f"UPDATE {quote(meta.db_table)} SET {column['text']} = %s, {column['updated_at']} = %s "
        f"WHERE {quote(meta.pk.column)} = %s AND {column['status']} = %s"
    )


def partial_writes(texts: list[tuple[int, str]]) -> None:
    """Write each (message id, text) to its answer if that is still streaming (an answer that
    has ended is left as its final store wrote it). One statement each, each its own
    transaction: the answers' saves are independent, and a transaction around them all would
    hold the table's write lock longer for nothing (an in-memory SQLite with a shared cache, the
    tests', refuses a reader meanwhile)."""
    try:
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        streaming = str(Message.Status.STREAMING)
        with connection.cursor() as cursor:
            cursor.executemany(
                _update_sql(), [[text, now, message_id, streaming] for message_id, text in texts]
            )
    finally:
        # Kept for the next save, not aged out (CONN_MAX_AGE=0 would close it now); one that
        # failed is still closed. `_connection_release` closes it once no answer is saving.
        connection.close_at = None
        connection.close_if_unusable_or_obsolete()


def _connection_release() -> None:
    """In the writer thread: close its connection if no answer started saving meanwhile."""
    if not PartialSaver.saving:
        connection.close()


class PartialSaver:
    """Saves one running answer's text as it grows (see the module's docstring)."""

    # How many answers are saving (counted on the event loop): the writer's connection stays
    # open while there are any.
    saving = 0

    def __init__(
        self,
        message_id: int,
        *,
        saved: str = "",
        every_s: float = SAVE_EVERY_SECONDS,
        every_chunks: int = SAVE_EVERY_CHUNKS,
    ):
        self.message_id = message_id
        self.every_s = every_s
        self.every_chunks = every_chunks
        self.text = self.saved = saved
        self.writes = 0
        self._chunks = 0
        self._saves: _Saves | None = None
        self._closed = False

    def note(self, text: str) -> None:
        """The answer's text is now `text` (one more chunk); never blocks."""
        if self._closed:  # the final store is under way or done: nothing after it
            return
        self.text = text
        self._chunks += 1
        if self._saves is None:
            PartialSaver.saving += 1
            self._saves = _Saves.of(asyncio.get_running_loop())
            self._saves.join(self)
        if self._chunks >= self.every_chunks:
            self._saves.due.set()

    async def close(self) -> None:
        """Stop saving (the answer's final store follows); waits for a write under way."""
        self._closed = True
        saves, self._saves = self._saves, None
        if saves is not None:
            await saves.leave(self)
            PartialSaver.saving -= 1
            if not PartialSaver.saving:  # after the writes still queued: the executor keeps order
                _writer.submit(_connection_release)


class _Saves:
    """The running answers of one event loop, saved together by one task while there are any."""

    _of_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Saves] = (
        weakref.WeakKeyDictionary()
    )

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _Saves:
        saves = cls._of_loop.get(loop)
        if saves is None:
            saves = cls._of_loop[loop] = cls(loop)
        return saves

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.savers: set[PartialSaver] = set()
        self.due = asyncio.Event()  # a saver's chunks fell due: save now
        self.writing: asyncio.Future | None = None
        self._task: asyncio.Task | None = None

    def join(self, saver: PartialSaver) -> None:
        self.savers.add(saver)
        if self._task is None or self._task.done():
            self._task = self.loop.create_task(self._run(), name="partial-saves")

    async def leave(self, saver: PartialSaver) -> None:
        """No more saves of `saver`; returns once a write under way (maybe of its text) ended."""
        self.savers.discard(saver)
        if not self.savers:
            self.due.set()  # the task sees there is nobody left and ends
        writing = self.writing
        if writing is not None and not writing.done():
            # Its failure is the saves' to log; the answer's final store goes ahead regardless.
            with contextlib.suppress(Exception):
                await asyncio.shield(writing)

    async def _run(self) -> None:
        while self.savers:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the wait's result
            # when the wait ends as the task is cancelled, swallowing the cancel.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(s.every_s for s in self.savers)):
                    await self.due.wait()
            self.due.clear()
            changed = [(saver, saver.text) for saver in self.savers if saver.text != saver.saved]
            if not changed:
                continue
            for saver, _ in changed:
                saver._chunks = 0
            texts = [(saver.message_id, text) for saver, text in changed]
            self.writing = self.loop.run_in_executor(_writer, partial_writes, texts)
            try:
                # Not cancelled by an answer's end: the write under way finishes first.
                await asyncio.shield(self.writing)
            except DatabaseError as exc:
                log.warning("could not save the text of %d answers so far: %s", len(texts), exc)
                continue
            except Exception:  # tried again at the next save, as a database error is
                log.exception("could not save the text of %d answers so far", len(texts))
                continue
            for saver, text in changed:
                saver.saved = text
                saver.writes += 1
