"""Per-answer gates: fed chunks, they decide what the user sees, and judge the whole at the end
(their actions and outcome: actions.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .actions import Action, Cut, Emit, Hold, Outcome, Retract
from .extraction import ExtractionError, extract_json
from .moderation import ModerationHook, Verdict, moderate
from .structure import scan
from .tool_calls import ToolSpec, judge_calls
from .validation import instance_errors

__all__ = [
    "Gate",
    "StreamGate",
    "BufferGate",
    "AutoGate",
    "ToolCallGate",
    "gate_for",
    "MODES",
]

# A re-ask prompt for a 135M model must stay short; the first few errors carry the signal.
_MAX_REASONS = 5


class Gate:
    """Shared bookkeeping: assembled text, what was shown, windowed moderation, retraction.

    With a hold-back window of W characters, text is shown only once hooks have judged it with
    at least W characters after it (they run every W/2 characters, at most every window_chars), so a match up to W characters long is caught (and masked or
    vetoed) before any of it is shown. W = 0 shows text as it comes and judges it every
    `window_chars` characters (a veto then withdraws what was shown).
    """

    hold_reason = "validating structured answer"

    def __init__(
        self,
        hooks: Iterable[ModerationHook],
        *,
        window_chars: int = 64,
        holdback_chars: int = 0,
        shown: str = "",
    ) -> None:
        """`shown`: the answer so far, already shown and judged (a continued answer)."""
        if isinstance(window_chars, bool) or not isinstance(window_chars, int) or window_chars < 1:
            raise ValueError(f"window_chars must be a positive integer, not {window_chars!r}")
        if (
            isinstance(holdback_chars, bool)
            or not isinstance(holdback_chars, int)
            or holdback_chars < 0
        ):
            raise ValueError(f"holdback_chars must be 0 or more, not {holdback_chars!r}")
        # Each hook as this answer's own: one may keep what it learnt of the text between checks.
        self._hooks = tuple(hook.for_answer() for hook in hooks)
        self._window_chars = window_chars
        # A hook that rewrites text (a mask) needs its matches whole before any of them shows.
        self._holdback = max([holdback_chars, *(hook.min_holdback for hook in self._hooks)])
        self._text = shown
        self._shown = shown
        self._checked = len(shown)  # length of text at the last windowed check
        self._cleared = len(shown)  # text[:_cleared] passed the hooks with W characters after it
        self._outcome: Outcome | None = None
        self._cut: Verdict | None = None
        self._uncut = ""  # the text as generated, before a cut
        self._masked = ""  # the reason of the first hook that rewrote the text

    @property
    def holdback(self) -> int:
        """The hold-back window in characters: the policy's, or more if a hook needs it."""
        return self._holdback

    @property
    def text(self) -> str:
        """Everything generated so far (up to a retraction), masks applied."""
        return self._text

    @property
    def shown(self) -> str:
        """Everything emitted so far; after a Retract, this is what must be withdrawn."""
        return self._shown

    @property
    def raw(self) -> str:
        """Everything generated, a part cut off included (stored for review), masks applied."""
        return self._uncut or self._text

    @property
    def masked(self) -> str | None:
        """Why a hook rewrote part of the answer (the first reason), or None: the raw text is
        kept masked too, so this is the only trace that the user's text is not the model's."""
        return self._masked or None

    @property
    def cut(self) -> str | None:
        """Why the answer was cut short (then its text is the good part), or None."""
        return None if self._cut is None else self._cut.reason

    @property
    def retracted(self) -> bool:
        """True once the gate has said Retract; further chunks are ignored."""
        return self._outcome is not None and self._outcome.status == "moderated"

    def feed(self, chunk: str) -> list[Action]:
        """Take the next chunk (any size, any boundary) and say what to do now."""
        if self._outcome is not None or self._cut is not None or not chunk:
            return []
        self._text += chunk
        if self._holdback:
            # Each release is judged first, in steps of half the window (at most window_chars):
            # text shows W to 1.5 W characters behind the model, and a slow hook runs less often.
            step = max(1, min(self._window_chars, self._holdback // 2))
            due = len(self._text) - self._holdback - self._cleared >= step
        else:
            # Per-window, not per-chunk: chunks can be one character and hooks scan everything.
            due = len(self._text) - self._checked >= self._window_chars
        if due:
            self._checked = len(self._text)
            verdict = moderate(self._hooks, self._text, final=False)
            if verdict.replacement is not None and not self._replace(verdict):
                return self._retract(_too_late(verdict))
            if not verdict.allowed:
                return self._veto(verdict)
            self._cleared = max(self._cleared, len(self._text) - self._holdback)
        return self._after_feed(chunk)

    def finish(self) -> tuple[list[Action], Outcome]:
        """Judge the complete answer; calling it again returns the same outcome, no actions."""
        if self._outcome is not None:
            return [], self._outcome
        # Moderation first: a vetoed answer must not be re-asked as merely "invalid", and
        # windowed vetoes then agree with the final one whatever the chunking was.
        cut_before = self._cut
        actions = self._settle()
        if self._outcome is not None:
            return actions, self._outcome
        if self._cut is not cut_before:
            actions += self._cut_actions()
        judged, self._outcome = self._judge()
        return actions + judged, self._outcome

    def _limit(self, *, final: bool) -> int:
        """text[:limit] may be shown now: all of it at the end or without a window."""
        if final or not self._holdback:
            return len(self._text)
        return self._cleared

    def _release(self, *, final: bool) -> list[Action]:
        """Mode-specific: show what may be shown of the text (up to `_limit`)."""
        return []

    def _after_feed(self, chunk: str) -> list[Action]:
        """Mode-specific reaction to a chunk that passed moderation."""
        raise NotImplementedError

    def _judge(self) -> tuple[list[Action], Outcome]:
        """Mode-specific final verdict on text that passed moderation."""
        raise NotImplementedError

    def _emit(self, text: str) -> list[Action]:
        """Record and return an Emit, or nothing for empty text."""
        if not text:
            return []
        self._shown += text
        return [Emit(text)]

    def _settle(self) -> list[Action]:
        """Judge the text as complete until no hook objects: masks applied, cuts taken (the
        caller announces them); a veto without a cut retracts (then _outcome is set)."""
        while True:  # a cut shortens the text, so this ends
            verdict = moderate(self._hooks, self._text, final=True)
            if verdict.replacement is not None and not self._replace(verdict):
                return self._retract(_too_late(verdict))
            if verdict.allowed:
                return []
            if verdict.cut_at is None:
                return self._retract(verdict)
            self._apply_cut(verdict)

    def _veto(self, verdict: Verdict) -> list[Action]:
        """Cut the answer where the verdict allows it, else withdraw it whole."""
        if verdict.cut_at is None:
            return self._retract(verdict)
        self._apply_cut(verdict)
        # Nothing more will come: the kept part is judged whole before its held part shows.
        actions = self._settle()
        if self._outcome is not None:
            return actions
        return self._cut_actions()

    def _cut_actions(self) -> list[Action]:
        """Show the kept part's held-back rest, then the Cut (its text is all that was shown)."""
        assert self._cut is not None
        return self._release(final=True) + [Cut(self.shown, self._cut.reason)]

    def _apply_cut(self, verdict: Verdict) -> None:
        self._cut = verdict
        self._uncut = self._uncut or self._text
        self._text = self._text[: verdict.cut_at]
        self._shown = self._shown[: verdict.cut_at]  # what was shown is a prefix of the text
        self._cleared = min(self._cleared, len(self._text))
        self._after_cut()

    def _replace(self, verdict: Verdict) -> bool:
        """Take a hook's rewritten text; False if it changes what was already shown."""
        text = verdict.replacement or ""
        if not text.startswith(self._shown):
            self._text = text  # still withdrawn, but the raw text is not what gets stored
            return False
        if text != self._text and not self._masked:
            self._masked = verdict.reason or "masked"
        self._text = text
        self._cleared = len(self._shown)  # positions after the change moved: judge again
        self._after_replace()
        return True

    def _after_cut(self) -> None:
        """Mode-specific bookkeeping once the text was cut shorter."""

    def _after_replace(self) -> None:
        """Mode-specific bookkeeping once a hook rewrote the text."""

    def _retract(self, verdict: Verdict) -> list[Action]:
        """Stop for good: fix the outcome so later feeds and finish() change nothing."""
        self._outcome = Outcome(
            "moderated", self._text, None, verdict.reason, "", verdict.categories
        )
        return [Retract(verdict.reason)]

    def _structured(self, held: str, schema: object | None) -> Outcome:
        """Parse and validate a held part; one place so buffer and auto agree."""
        try:
            value = extract_json(held)
        except ExtractionError as exc:
            return Outcome("invalid", self._text, None, str(exc), held)
        if schema is not None:
            errors = instance_errors(value, schema)
            if errors:
                more = len(errors) - _MAX_REASONS
                reason = "; ".join(errors[:_MAX_REASONS])
                if more > 0:
                    reason += f"; and {more} more"
                return Outcome("invalid", self._text, value, reason, held)
        return Outcome("ok", self._text, value, "", held)


def _too_late(verdict: Verdict) -> Verdict:
    """A hook rewrote text that was already shown: the answer can only be withdrawn."""
    reason = f"{verdict.reason or 'masked text'} was already shown (hold-back window too short)"
    return Verdict(False, reason, verdict.categories)


class StreamGate(Gate):
    """Shows chunks as they come (W characters behind with a hold-back window); moderation
    runs on windows of the growing text."""

    def _after_feed(self, chunk: str) -> list[Action]:
        return self._release(final=False)

    def _release(self, *, final: bool) -> list[Action]:
        return self._emit(self._text[len(self._shown) : self._limit(final=final)])

    def _judge(self) -> tuple[list[Action], Outcome]:
        return self._release(final=True), Outcome("ok", self._text)


class _StructuredGate(Gate):
    """A gate that validates held-back text against an optional JSON Schema."""

    def __init__(
        self,
        hooks: Iterable[ModerationHook],
        schema: object | None = None,
        *,
        window_chars: int = 64,
        holdback_chars: int = 0,
        shown: str = "",
    ) -> None:
        super().__init__(
            hooks, window_chars=window_chars, holdback_chars=holdback_chars, shown=shown
        )
        self._schema = schema


class BufferGate(_StructuredGate):
    """Shows nothing until the end, then the whole answer must be (schema-valid) JSON."""

    hold_reason = "holding the answer until it is complete"
    _holding = False

    def _after_feed(self, chunk: str) -> list[Action]:
        if self._holding:
            return []
        self._holding = True
        return [Hold(self.hold_reason)]

    def _judge(self) -> tuple[list[Action], Outcome]:
        return [], self._structured(self._text, self._schema)


class ToolCallGate(BufferGate):
    """Holds the answer, then judges its tool calls (chat/policy/tool_calls.py): an answer with
    calls has them as its JSON value, `{"tool_calls": [{"name", "arguments"}, ...]}`; prose
    (allowed under tool_choice "auto") has none."""

    hold_reason = "holding the answer until its tool calls are checked"

    def __init__(
        self,
        hooks: Iterable[ModerationHook],
        tools: ToolSpec,
        *,
        window_chars: int = 64,
        shown: str = "",
    ) -> None:
        super().__init__(hooks, None, window_chars=window_chars, shown=shown)
        self._tools = tools

    def _judge(self) -> tuple[list[Action], Outcome]:
        judged = judge_calls(self._text, self._tools)
        if judged.error:
            return [], Outcome("invalid", self._text, None, judged.error, self._text)
        value = {"tool_calls": [c.as_dict() for c in judged.calls]} if judged.calls else None
        return [], Outcome("ok", self._text, value, "", self._text)


class AutoGate(_StructuredGate):
    """Streams prose; from a JSON fence or a leading { / [ on, holds and validates the rest."""

    _hold_at: int | None = None
    _hold_sent = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._emitted = len(self._text)  # text[:_emitted] has been shown

    def _after_feed(self, chunk: str) -> list[Action]:
        return self._advance(final=False)

    def _release(self, *, final: bool) -> list[Action]:
        return self._advance(final=final)

    def _after_cut(self) -> None:
        self._emitted = min(self._emitted, len(self._text))
        if self._hold_at is not None and self._hold_at >= len(self._text):
            self._hold_at = None

    def _after_replace(self) -> None:
        if self._hold_at is not None:
            # A mask before the held block moved it; masks hold no fences or braces.
            self._hold_at = scan(self._text, self._emitted, final=False).hold

    def _judge(self) -> tuple[list[Action], Outcome]:
        # At the end a possible fence start that never completed is just prose: flush it.
        actions = self._advance(final=True)
        if self._hold_at is None:
            return actions, Outcome("ok", self._text)
        return actions, self._structured(self._text[self._hold_at :], self._schema)

    def _advance(self, *, final: bool) -> list[Action]:
        """Show what can no longer turn out to be part of a held structured block, and has
        cleared the hold-back window; say Hold once all prose before the block is shown."""
        limit = self._limit(final=final)
        if self._hold_at is None:
            safe, self._hold_at = scan(self._text, self._emitted, final=final)
        else:
            safe = self._hold_at  # prose before the block still shows once it clears the window
        end = max(self._emitted, min(safe, limit))
        actions = self._emit(self._text[self._emitted : end])
        self._emitted = end
        if self._hold_at is not None and end >= self._hold_at and not self._hold_sent:
            self._hold_sent = True
            actions.append(Hold(self.hold_reason))
        return actions


MODES = ("stream", "buffer", "auto")


def gate_for(
    mode: str,
    *,
    hooks: Iterable[ModerationHook],
    schema: object | None = None,
    window_chars: int = 64,
    holdback_chars: int = 0,
    shown: str = "",
    tools: ToolSpec | None = None,
) -> Gate:
    """The gate for a policy mode; stream ignores the schema (the caller picks buffer for it).
    `shown` is the answer so far when the gate judges the rest of a continued answer;
    `holdback_chars` is how far behind the model prose is shown (0: as it comes). With
    `tools` the answer is held and its calls judged, whatever the mode."""
    if tools is not None:
        return ToolCallGate(hooks, tools, window_chars=window_chars, shown=shown)
    if mode == "stream":
        return StreamGate(
            hooks, window_chars=window_chars, holdback_chars=holdback_chars, shown=shown
        )
    if mode in ("buffer", "auto"):
        gate = BufferGate if mode == "buffer" else AutoGate
        return gate(
            hooks, schema, window_chars=window_chars, holdback_chars=holdback_chars, shown=shown
        )
    raise ValueError(f"unknown output mode {mode!r} (expected one of {', '.join(MODES)})")
