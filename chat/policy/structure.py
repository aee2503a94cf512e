"""Find where a streamed answer turns structured, without ever deciding on half a fence."""

from __future__ import annotations

import re
from enum import Enum
from typing import NamedTuple

__all__ = ["Scan", "scan"]

# Characters of a fence's language tag ("json", "c++", "objective-c").
_LANG = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+.-")
_LEADING_SPACE = re.compile(r"\s*")


class _Match(Enum):
    """Whether a trigger starts at a position; MAYBE means the text ends too soon to say."""

    NO = "no"
    MAYBE = "maybe"
    YES = "yes"


class Scan(NamedTuple):
    """Text before `safe` may be shown; `hold` is where structure starts (None: not yet/never)."""

    safe: int
    hold: int | None


def scan(text: str, start: int, *, final: bool) -> Scan:
    """Decide text[start:]; only YES/NO are final, so any later chunking gives the same answer."""
    if start == 0:
        leading = _leading(text, final=final)
        if leading is _Match.YES:
            return Scan(0, 0)
        if leading is _Match.MAYBE:
            return Scan(0, None)
    index = start
    while (index := text.find("`", index)) >= 0:
        match = _fence_at(text, index, final=final)
        if match is _Match.YES:
            return Scan(index, index)
        if match is _Match.MAYBE:
            return Scan(index, None)
        index += 1
    return Scan(len(text), None)


def _leading(text: str, *, final: bool) -> _Match:
    """An answer whose first visible character is { or [ is structured as a whole."""
    leading = _LEADING_SPACE.match(text)
    assert leading is not None  # \s* matches at the start of any string
    first = leading.end()
    if first == len(text):
        # Leading whitespace is invisible; holding it keeps held_text chunking-independent.
        return _Match.NO if final else _Match.MAYBE
    return _Match.YES if text[first] in "{[" else _Match.NO


def _fence_at(text: str, index: int, *, final: bool) -> _Match:
    """Does a ```json fence, or a ```lang fence whose body opens with { or [, start here?"""
    undecided = _Match.NO if final else _Match.MAYBE
    end = len(text)
    cursor = index
    for _ in range(3):
        if cursor >= end:
            return undecided
        if text[cursor] != "`":
            return _Match.NO
        cursor += 1
    cursor = _skip(text, cursor, " \t")
    lang_start = cursor
    while cursor < end and text[cursor] in _LANG:
        cursor += 1
    if cursor >= end:
        return undecided
    if text[lang_start:cursor].lower() == "json":
        # "```json" then anything that is not more tag ("```jsonl" is another language).
        return _Match.YES
    cursor = _skip(text, cursor, " \t\r")
    if cursor >= end:
        return undecided
    if text[cursor] != "\n":
        return _Match.NO  # inline ``` or a fence with an info string: not a JSON block
    cursor = _skip(text, cursor + 1, " \t\r\n")
    if cursor >= end:
        return undecided
    return _Match.YES if text[cursor] in "{[" else _Match.NO


def _skip(text: str, cursor: int, chars: str) -> int:
    """Index of the first character at or after `cursor` not in `chars`."""
    while cursor < len(text) and text[cursor] in chars:
        cursor += 1
    return cursor
