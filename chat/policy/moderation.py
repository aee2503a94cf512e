"""Moderation hooks: small, configurable checks that may veto an answer as it grows."""

from __future__ import annotations

import copy
import importlib
import re
from abc import ABC, abstractmethod
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "Verdict",
    "ALLOWED",
    "ModerationHook",
    "BlocklistHook",
    "RepetitionHook",
    "HookConfigError",
    "HOOKS",
    "load_hook",
    "moderate",
]


# Longest repeating span looked for; longer loops still trip the line/sentence count.
_MAX_PERIOD = 200
_WORD = re.compile(r"\w")
# Where an answer's lines and sentences end: after . ! or ? and whitespace, or at newlines.
_SEGMENT_END = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(frozen=True)
class Verdict:
    """A hook's decision, with a reason staff can read and categories to count.

    `cut_at` says the answer is good up to that character and only what follows is vetoed
    (a loop, an invented next turn): the gate keeps text[:cut_at] and stops generating. None
    vetoes the whole answer, which is withdrawn.

    `replacement` (on an allowed verdict) is the whole text as it must read instead (personal
    data masked): the gate keeps it in place of the raw text, so only it is shown, stored and
    cached. Its change must lie in text not yet shown; the gate's hold-back window sees to it.
    """

    allowed: bool
    reason: str = ""
    categories: tuple[str, ...] = ()
    cut_at: int | None = None
    replacement: str | None = None


ALLOWED = Verdict(True)


class ModerationHook(ABC):
    """Base hook; subclasses take their settings as keyword arguments (from a stored dict).

    `min_holdback` is the hold-back window (characters) the hook needs to work while an answer
    streams: a hook that rewrites text (a mask) must see a whole match before any of it is
    shown, so the gate holds back at least this much whatever the policy says.
    """

    min_holdback: int = 0
    # True for hooks that wait on a service: the turn then calls the gate off the event loop.
    blocking: bool = False

    @abstractmethod
    def check(self, text: str, *, final: bool) -> Verdict:
        """Judge the answer so far; `final` is False while more text may still arrive."""

    def for_answer(self) -> ModerationHook:
        """The hook as one answer's gate uses it: a hook that keeps what it learnt of the text
        between checks (the answer only grows) returns a copy of its own; most keep nothing."""
        return self

    def reach_problems(self) -> list[str]:
        """What the hook would reach that the operator does not allow (a service's host, a
        secret): the admin's form refuses a policy with any. A local hook reaches nothing."""
        return []


class HookConfigError(ValueError):
    """A hook path or its settings are wrong; raised at load time so staff see it on save."""


def _strings(name: str, values: object) -> list[str]:
    """Settings lists must be lists: a bare string would silently become its characters."""
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a list of strings")
    values = list(values)
    if not all(isinstance(value, str) for value in values):
        raise TypeError(f"{name} must be a list of strings")
    return values


def _positive_int(name: str, value: object) -> int:
    """Reject bools and zero early; both would make a check silently useless."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TypeError(f"{name} must be a positive integer, not {value!r}")
    return value


class BlocklistHook(ModerationHook):
    """Vetoes answers containing a listed term (whole word, any case) or matching a regex."""

    def __init__(self, *, terms: Iterable[str] = (), patterns: Iterable[str] = ()) -> None:
        self._checks: list[tuple[re.Pattern[str], str]] = []
        for term in _strings("terms", terms):
            if not term.strip():
                raise ValueError("blocklist terms must not be empty")
            # Lookarounds instead of \b so terms starting or ending in punctuation still work.
            regex = re.compile(rf"(?<!\w){re.escape(term.strip())}(?!\w)", re.IGNORECASE)
            self._checks.append((regex, f"blocked term: {term.strip()!r}"))
        for pattern in _strings("patterns", patterns):
            try:
                regex = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid blocklist pattern {pattern!r}: {exc}") from None
            self._checks.append((regex, f"blocked pattern: {pattern!r}"))

    def check(self, text: str, *, final: bool) -> Verdict:
        """First listed term or pattern found; matches still growing at the end wait."""
        for regex, reason in self._checks:
            for match in regex.finditer(text):
                # "ass" at the end may become "assistant" with the next chunk.
                if final or match.end() < len(text):
                    return Verdict(False, reason, ("blocklist",))
        return ALLOWED


class RepetitionHook(ModerationHook):
    """Cuts a rambling model short: too long, repeating itself, or writing the user's next turn.

    Its verdicts keep the answer's good part (`Verdict.cut_at`): one copy of a loop, the text
    before an invented turn, the first max_chars characters.
    """

    def __init__(
        self,
        *,
        max_chars: int = 4000,
        max_repeats: int = 4,
        min_span: int = 20,
        turn_markers: Iterable[str] = ("\nUser:", "\nuser:", "<|im_start|>"),
    ) -> None:
        self.max_chars = _positive_int("max_chars", max_chars)
        self.max_repeats = _positive_int("max_repeats", max_repeats)
        self.min_span = _positive_int("min_span", min_span)
        self.turn_markers = [marker for marker in _strings("turn_markers", turn_markers) if marker]
        # One answer's, kept between its checks (for_answer): each check reads only new text.
        self._index: _GramIndex | None = None
        self._segments: _SegmentCounts | None = None

    def for_answer(self) -> RepetitionHook:
        answer = copy.copy(self)
        answer._index = _GramIndex(self.min_span, self.max_repeats + 1)
        answer._segments = _SegmentCounts(self.min_span)
        return answer

    def check(self, text: str, *, final: bool) -> Verdict:
        """Runaway first (most specific), then repetition, then plain length."""
        # A leading newline lets "\nUser:" also catch a turn at the very start.
        padded = "\n" + text
        for marker in self.turn_markers:
            at = padded.find(marker)
            if at >= 0:
                reason = f"the model wrote another turn ({marker.strip()!r})"
                return Verdict(False, reason, ("runaway",), cut_at=_clean_cut(text, max(at - 1, 0)))
        repeated, first, second = self._repeated(text, final=final)
        if repeated:
            reason = f"repeated text: {repeated[:60]!r}"
            cut = _loop_cut(text, first, second)
            return Verdict(False, reason, ("repetition",), cut_at=cut)
        if len(text) > self.max_chars:
            reason = f"answer longer than {self.max_chars} characters"
            return Verdict(False, reason, ("length",), cut_at=_clean_cut(text, self.max_chars))
        return ALLOWED

    def _repeated(self, text: str, *, final: bool) -> tuple[str, int, int]:
        """A span occurring more than max_repeats times, back to back or as lines/sentences,
        and where its first and second copies start (the text before the second is kept)."""
        span, first, second = self._loop(text)
        if span:
            return span, first, second
        segments = self._segments or _SegmentCounts(self.min_span)
        # The last segment may still be growing; counting it could veto too early.
        segment, count = segments.most_repeated(text, final=final)
        if count > self.max_repeats:
            first = text.find(segment)
            return segment, first, text.find(segment, first + len(segment))
        return "", 0, 0

    def _loop(self, text: str) -> tuple[str, int, int]:
        """A span of min_span.._MAX_PERIOD chars repeated back to back over max_repeats times,
        and where its first and second copies start."""
        # Such a loop repeats its first min_span characters at a fixed stride, so only
        # positions of recurring min_span-grams are candidates: linear on ordinary prose.
        width, copies = self.min_span, self.max_repeats + 1
        index = self._index or _GramIndex(width, copies)
        index.update(text)
        for gram in index.candidates():
            positions = index.starts[gram]
            for n, first in enumerate(positions):
                for m in range(n + 1, len(positions)):
                    period = positions[m] - first
                    if period < width:
                        continue  # the span itself must be at least min_span long
                    if period > max(width, _MAX_PERIOD):
                        break
                    other = positions[m]
                    # Period p holds over k+1 copies iff the text equals itself shifted by p.
                    end = first + period * copies
                    if end <= len(text) and text[first : end - period] == text[other:end]:
                        unit = _shortest_unit(text[first:other])
                        return unit, first, first + len(unit)
        return "", 0, 0


class _GramIndex:
    """Where each width-gram of a growing text starts, and the grams that recur often enough to
    be a loop. Kept between one answer's checks, a check indexes only the text added since the
    last one: the gate checks every window, so a rescan each time was quadratic in the answer."""

    def __init__(self, width: int, copies: int) -> None:
        self.width, self.copies = width, copies
        self._clear()

    def _clear(self) -> None:
        self.text = ""
        self.starts: dict[str, list[int]] = defaultdict(list)
        self._recurring: dict[str, None] = {}  # with `copies` starts or more, and a word in it

    def update(self, text: str) -> None:
        if not text.startswith(self.text):  # masked or cut since: index it afresh
            self._clear()
        width, starts = self.width, self.starts
        for at in range(max(len(self.text) - width + 1, 0), len(text) - width + 1):
            gram = text[at : at + width]
            positions = starts[gram]
            positions.append(at)
            # Loops of "-----" or blank lines are layout, not rambling; skipping them also
            # keeps this from going quadratic on long runs of one symbol.
            if len(positions) == self.copies and _WORD.search(gram):
                self._recurring[gram] = None
        self.text = text

    def candidates(self) -> list[str]:
        """The recurring grams in the order of their first start, as a scan of the text meets them."""
        return sorted(self._recurring, key=lambda gram: self.starts[gram][0])


class _SegmentCounts:
    """How often each line or sentence of a growing answer occurs, kept between one answer's
    checks: a check splits only the text after the last complete segment (a rescan of the
    whole answer at every check was quadratic in its length, most of a relayed token's policy
    time)."""

    def __init__(self, min_span: int) -> None:
        self.min_span = min_span
        self._clear()

    def _clear(self) -> None:
        self.text = ""
        self.complete = 0  # where the segment still growing starts
        self.counts: Counter[str] = Counter()

    def most_repeated(self, text: str, *, final: bool) -> tuple[str, int]:
        """The complete segment (with `final`, the last one too) occurring most, and how often."""
        if not text.startswith(self.text):  # masked or cut since: count it afresh
            self._clear()
        tail = text[self.complete :]
        ends = list(_SEGMENT_END.finditer(tail))
        start = 0
        for end in ends:
            self._count(tail[start : end.start()], self.counts)
            start = end.end()
        self.complete += start
        self.text = text
        counts = self.counts
        if final:  # the growing segment counts too, without being kept
            counts = self.counts.copy()
            self._count(text[self.complete :], counts)
        for segment, count in counts.most_common(1):
            return segment, count
        return "", 0

    def _count(self, segment: str, counts: Counter[str]) -> None:
        segment = segment.strip()
        if len(segment) >= self.min_span and _WORD.search(segment):
            counts[segment] += 1


def _shortest_unit(span: str) -> str:
    """The shortest piece `span` is made of ("ab" for "ababab"): a loop shorter than min_span
    is found as several copies, and the answer keeps only one."""
    for size in range(1, len(span) // 2 + 1):
        if len(span) % size == 0 and span[:size] * (len(span) // size) == span:
            return span[:size]
    return span


_PAUSES = ".!?,;:"


def _loop_cut(text: str, first: int, second: int) -> int:
    """Where to cut a loop whose copies start at `first` and `second`: after the text before it
    and one copy, ended where that copy's sentence, line or list item ends."""
    head = text[:second].rstrip()
    if head.endswith(tuple(_PAUSES)) or "\n" in text[len(head) : second]:
        return len(head)
    # The copy may start mid-sentence; its end is then where the next copy's first pause is.
    for index in range(second, min(len(text), 2 * second - first)):
        if text[index] in _PAUSES:
            return index + 1
        if text[index] == "\n":
            return len(text[:index].rstrip())
    return _clean_cut(text, second, floor=first)


def _clean_cut(text: str, at: int, *, floor: int = 0) -> int:
    """Where to cut `text` in floor..at so that no word or sentence is left half-shown: after
    the last sentence end or line break there, else at the last space, else at `at`."""
    head = text[:at]
    ends = [head.rfind(mark, floor) for mark in (". ", "! ", "? ", "\n")]
    ends = [end + 1 for end in ends if end >= 0]
    if head.endswith((".", "!", "?")):
        ends.append(len(head))
    best = max(ends, default=0)
    if best > floor:
        return len(head[:best].rstrip())
    if not (head[-1:].isalnum() and text[at : at + 1].isalnum()):
        return len(head.rstrip())  # `at` is already between words
    space = head.rfind(" ", floor)
    return len(head[:space].rstrip()) if space > floor else len(head.rstrip())


HOOKS: dict[str, str] = {
    "blocklist": "chat.policy.moderation.BlocklistHook",
    "repetition": "chat.policy.moderation.RepetitionHook",
    "personal_data": "chat.policy.pii.PersonalDataHook",
    "profanity": "chat.policy.profanity.ProfanityHook",
    "remote_moderation": "chat.policy.remote_moderation.RemoteModerationHook",
    "guard": "chat.policy.guard.GuardModelHook",
}


def load_hook(path_or_name: str, settings: dict[str, Any] | None = None) -> ModerationHook:
    """Build a hook from a short name or dotted path, turning every mistake into HookConfigError."""
    path = HOOKS.get(path_or_name, path_or_name)
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        known = ", ".join(sorted(HOOKS))
        raise HookConfigError(
            f"unknown moderation hook {path_or_name!r} (known: {known}, or a dotted path)"
        )
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise HookConfigError(f"cannot load moderation hook {path!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, ModerationHook)):
        raise HookConfigError(f"{path!r} is not a ModerationHook subclass")
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        kind = type(settings).__name__
        raise HookConfigError(f"settings for {path_or_name!r} must be an object, not {kind}")
    try:
        return cls(**settings)
    except (TypeError, ValueError) as exc:
        raise HookConfigError(f"bad settings for moderation hook {path_or_name!r}: {exc}") from None


def moderate(hooks: Iterable[ModerationHook], text: str, *, final: bool) -> Verdict:
    """The first veto wins; hooks are ordered by whoever configured them. A hook's replacement
    is what the hooks after it judge, and the result carries the text as all of them left it."""
    original = text
    reasons: list[str] = []
    categories: list[str] = []
    for hook in hooks:
        verdict = hook.check(text, final=final)
        if not verdict.allowed:
            # A veto's cut_at counts in the masked text; the gate masks before it cuts.
            return verdict if text == original else replace(verdict, replacement=text)
        if verdict.replacement is not None and verdict.replacement != text:
            text = verdict.replacement
            reasons.append(verdict.reason)
            categories.extend(verdict.categories)
    if text == original:
        return ALLOWED
    return Verdict(True, "; ".join(filter(None, reasons)), tuple(categories), replacement=text)
