"""Stop strings the user must never see, held back from streamed text (no torch: the remote
backend in a web process uses it too)."""

from __future__ import annotations


class StopStringHoldback:
    """Filters streamed text so that no stop string, whole or half, reaches the user.

    Text that could still turn into a stop string is held back until it is clear
    (as vLLM does); once a stop string appears, it and everything after it is dropped.
    Chunk boundaries do not matter: feeding "ab" or "a" then "b" gives the same output.

    Args:
        stop_strings: the strings that end the answer.
    """

    def __init__(self, stop_strings: tuple[str, ...] | list[str]):
        self.stop_strings = tuple(s for s in stop_strings if s)
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Return the part of `text` that is safe to show now."""
        if self.stopped or not text:
            return ""
        if not self.stop_strings:
            return text
        self._pending += text
        cut = min(
            (i for i in (self._pending.find(s) for s in self.stop_strings) if i >= 0), default=-1
        )
        if cut >= 0:
            self.stopped = True
            visible, self._pending = self._pending[:cut], ""
            return visible
        keep = self._longest_partial_suffix(self._pending)
        visible = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(visible) :]
        return visible

    def finish(self) -> str:
        """Release what was held back when the answer ended without a stop string."""
        rest, self._pending = ("" if self.stopped else self._pending), ""
        return rest

    def _longest_partial_suffix(self, text: str) -> int:
        longest = 0
        for stop in self.stop_strings:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
