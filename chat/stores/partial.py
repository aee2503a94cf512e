"""A running answer's text saved as it grows, so a crash keeps what the user already read.

At least every `every_s` seconds or every `every_chunks` chunks, whichever comes first, the text
so far is written to the answer's message, from the turn's asyncio side through one worker
thread for the whole process. The decode step never waits on the database: a write still under
way when the text grows again is not queued behind, the next write simply takes the newest
text (writes coalesce). Only a message still `streaming` is written, so a late write can never
undo the answer's final store (chat/stores/storage.py); after a crash, the start-up sweep
(chat/stores/recovery.py) marks it interrupted and keeps that text.

The thread keeps its database connection while any answer is saving and closes it when the last
one ends: under CONN_MAX_AGE=0 a connection opened and closed for every save (two a second for
each answer running) was about a fifth of the web process's CPU while relaying answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
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


def partial_write(message_id: int, text: str) -> int:
    """Write `text` to the answer if it is still streaming; how many rows (0 once it ended)."""
    try:
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        with connection.cursor() as cursor:
            cursor.execute(_update_sql(), [text, now, message_id, str(Message.Status.STREAMING)])
            return cursor.rowcount
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

    # How many answers have a save task (counted on the event loop): the writer's connection
    # stays open while there are any.
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
        self._due = asyncio.Event()
        self._task: asyncio.Task | None = None

    def note(self, text: str) -> None:
        """The answer's text is now `text` (one more chunk); never blocks."""
        self.text = text
        self._chunks += 1
        if self._chunks >= self.every_chunks:
            self._due.set()
        if self._task is None:
            PartialSaver.saving += 1
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"partial-save-{self.message_id}"
            )

    async def close(self) -> None:
        """Stop saving (the answer's final store follows); waits for a write under way."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            PartialSaver.saving -= 1
            if not PartialSaver.saving:  # after the writes still queued: the executor keeps order
                _writer.submit(_connection_release)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the wait's result
            # when the wait ends as the task is cancelled (the 64th chunk and the answer's end
            # in one loop turn), swallowing the cancel: this loop went on and `close` waited
            # for it for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.every_s):
                    await self._due.wait()
            self._due.clear()
            text = self.text
            if text == self.saved:
                continue
            self._chunks = 0
            write = loop.run_in_executor(_writer, partial_write, self.message_id, text)
            try:
                # A cancel (the answer ends) lets the write under way finish first.
                await asyncio.shield(write)
            except asyncio.CancelledError:
                with contextlib.suppress(DatabaseError):
                    await write
                raise
            except DatabaseError as exc:
                log.warning("could not save the text of answer %s so far: %s", self.message_id, exc)
                continue
            self.saved = text
            self.writes += 1
