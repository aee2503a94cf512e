"""Giving freed memory back to the system after a big row leaves, or when the worker goes idle.

glibc raises its mmap threshold after the first big free (up to 32 MB), so a document's KV
columns and prefill activations later come from the heap, and small tensors allocated after them
pin the heap at its high-water mark: the process keeps the worst moment's RSS for good. Fixing
the threshold low gives every big buffer back as it is freed, but maps and unmaps one per decode
step (measured 19% slower at 8 users). `malloc_trim(0)` instead returns the free pages of every
arena once, at the moments worth it: a row of many tokens has just left the batch, or the batch
has emptied after real work. No-op where the C library has no `malloc_trim` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# A row this long holds about 90 MB of SmolLM2's KV: its end is worth a trim at once.
LONG_ROW_TOKENS = 2048
# Tokens of ended rows since the last trim that make an idle moment worth one: about 180 MB of
# SmolLM2's KV. Lower, a conversation's every turn would trim and its next answer pay the page
# faults (5-10 ms) of memory given back for nothing.
IDLE_TRIM_TOKENS = 4096
# Trims at most this often while the batch is busy (each walks every arena's free lists).
BUSY_INTERVAL_S = 5.0


def _libc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrimmer:
    """Counts the tokens of rows that ended and trims the heap when it is worth it.

    Called from the generation worker's thread only: `ended(tokens)` for each row that leaves,
    `idle()` before the worker waits for work.
    """

    def __init__(
        self,
        trim: Callable[[int], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._trim = trim if trim is not None else _libc_trim()
        self._clock = clock
        self._freed_tokens = 0
        self._owed = False
        self._last = float("-inf")

    @property
    def available(self) -> bool:
        return self._trim is not None

    def ended(self, tokens: int) -> None:
        """A row of `tokens` (prompt and answer) has left the batch."""
        self._freed_tokens += tokens
        if tokens >= LONG_ROW_TOKENS:
            if self._clock() - self._last >= BUSY_INTERVAL_S:
                self._run()
            else:
                self._owed = True  # trimmed a moment ago: the next idle moment gives it back

    def idle(self) -> None:
        """The batch is empty: trim if a long row or enough rows ended since the last trim."""
        if self._owed or self._freed_tokens >= IDLE_TRIM_TOKENS:
            self._run()

    def trim(self) -> None:
        """Trim now (after loading: the float weights a timing dropped)."""
        self._run()

    def _run(self) -> None:
        self._freed_tokens = 0
        self._owed = False
        self._last = self._clock()
        if self._trim is None:
            return
        started = time.perf_counter()
        self._trim(0)
        log.debug("heap trimmed in %.1f ms", (time.perf_counter() - started) * 1000)
