"""What a gate answers: the actions for the text shown now (`Emit`, `Hold`, `Retract`, `Cut`),
and the `Outcome` of the whole answer (gate.py)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Emit", "Hold", "Retract", "Cut", "Action", "Outcome"]


@dataclass(frozen=True)
class Emit:
    """Send this text to the user now."""

    text: str


@dataclass(frozen=True)
class Hold:
    """From here on text is held back; sent once so the UI can say why it waits."""

    reason: str


@dataclass(frozen=True)
class Retract:
    """Withdraw everything shown; the caller must stop generating."""

    reason: str


@dataclass(frozen=True)
class Cut:
    """Keep only `text` of what was shown (the rest was a loop or an invented turn); the caller
    must stop generating. The answer stands, cut short."""

    text: str
    reason: str


Action = Emit | Hold | Retract | Cut


@dataclass
class Outcome:
    """The verdict on the whole answer; held_text is what to show now, on "ok" only."""

    status: str  # "ok" | "invalid" | "moderated"
    text: str
    json: object | None = None
    reason: str = ""
    held_text: str = ""
    categories: tuple[str, ...] = ()
