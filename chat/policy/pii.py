"""Personal data in answers: e-mail addresses, phone numbers, card numbers and IBANs.

Found with regular expressions and confirmed by their checksums where they have one (Luhn
for cards, ISO 7064 mod 97 for IBANs), so an order number or a date is not taken for one.
Written here rather than taken from a library: the hook runs on every window of a streaming
answer and must stay well under a millisecond; libphonenumber's matcher needs a region and
costs milliseconds per call.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

from .moderation import ALLOWED, ModerationHook, Verdict

__all__ = ["PersonalDataHook", "KINDS", "luhn_valid", "iban_valid", "find_personal_data"]

# Bounded so that a match is never longer than MAX_MATCH: the hold-back window a mask needs.
_EMAIL = re.compile(
    r"(?<![\w.%+-])[\w.%+-]{1,32}@[A-Za-z0-9-]{1,24}(?:\.[A-Za-z0-9-]{1,24}){0,2}\.[A-Za-z]{2,6}(?![\w-])"
)
# An optional country code or trunk prefix, then 3-5 groups of digits split by one separator.
_PHONE = re.compile(
    r"(?<![\w+.-])(?:\+\d{1,3}[ .-]?|00\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,5}(?:[ .-]?\d{2,5}){1,4}(?![\w-])"
)
_CARD = re.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])")
_IBAN = re.compile(r"(?<![\w-])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}(?![\w-])")
_DATE = re.compile(r"\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{2,4}")

_GROUPS = re.compile(r"\d+")
# While text arrives, a match this close to the end, followed only by what could continue it,
# may still grow ("4111 1111 1111" into a card number, "example.co" into "example.com").
_GROW_SLACK = 16
_MAY_GROW = re.compile(rf"[\w .()+@%-]{{0,{_GROW_SLACK}}}")

MAX_MATCH = 64
# A mask must see every match whole before any of it is shown: the longest match, plus the
# text after it that may still continue it.
MASK_HOLDBACK = MAX_MATCH + _GROW_SLACK


def luhn_valid(digits: str) -> bool:
    """The Luhn check every payment card number passes."""
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def iban_valid(iban: str) -> bool:
    """ISO 13616: the country and check digits moved to the end, letters as 10..35, mod 97 == 1."""
    compact = iban.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    return int("".join(str(int(char, 36)) for char in moved)) % 97 == 1


def _digits(text: str) -> str:
    return "".join(char for char in text if char.isdigit())


def _card(match: str) -> bool:
    digits = _digits(match)
    if not (13 <= len(digits) <= 19 and luhn_valid(digits)):
        return False
    # Written in groups, a card number is grouped by fours (Amex and Diners: 4-6-5, 4-6-4);
    # other groupings that pass Luhn by chance are ISBNs and reference numbers.
    groups = [len(group) for group in re.split(r"[ -]", match)]
    return (
        len(groups) == 1
        or all(size == 4 for size in groups[:-1])
        and 1 <= groups[-1] <= 4
        or groups in ([4, 6, 5], [4, 6, 4])
    )


def _phone(match: str) -> bool:
    digits = _digits(match)
    if not 8 <= len(digits) <= 15 or _DATE.fullmatch(match):
        return False
    if match.startswith(("+", "00", "(")):
        return True  # dialled as a phone number
    # A bare run of digits is a number and two groups a range of years ("1999-2001").
    return len(_GROUPS.findall(match)) >= 3 or (len(digits) >= 10 and not match.isdigit())


_ACCEPT: dict[str, tuple[re.Pattern[str], Callable[[str], bool]]] = {
    # Order matters: an IBAN or a card number is also a run of digits a phone pattern takes.
    "iban": (_IBAN, lambda match: iban_valid(match)),
    "card": (_CARD, _card),
    "email": (_EMAIL, lambda match: True),
    "phone": (_PHONE, _phone),
}
KINDS = tuple(_ACCEPT)


def find_personal_data(text: str, kinds: tuple[str, ...] = KINDS) -> list[tuple[int, int, str]]:
    """Non-overlapping (start, end, kind) of personal data in `text`, in order."""
    found: list[tuple[int, int, str]] = []
    taken: list[tuple[int, int]] = []
    for kind in KINDS:
        if kind not in kinds:
            continue
        pattern, accept = _ACCEPT[kind]
        for match in pattern.finditer(text):
            start, end = match.span()
            if accept(match.group()) and not any(s < end and start < e for s, e in taken):
                found.append((start, end, kind))
                taken.append((start, end))
    return sorted(found)


class PersonalDataHook(ModerationHook):
    """Finds e-mail addresses, phone numbers, card numbers (Luhn-checked) and IBANs (mod-97
    checked). `mask` replaces each with a placeholder such as [email] before anything of it is
    shown, stored or cached (the policy holds back at least 80 characters for it); `block`
    withdraws the answer."""

    def __init__(
        self,
        *,
        action: Literal["mask", "block"] = "mask",
        kinds: list[str] = list(KINDS),  # noqa: B006 - never mutated; a form reads the default
        placeholder: str = "[{kind}]",
    ) -> None:
        if action not in ("mask", "block"):
            raise ValueError(f"action must be 'mask' or 'block', not {action!r}")
        if isinstance(kinds, str) or not all(kind in KINDS for kind in kinds) or not kinds:
            raise ValueError(f"kinds must be a non-empty list of {', '.join(KINDS)}")
        if not isinstance(placeholder, str) or not placeholder:
            raise ValueError("placeholder must be a non-empty string")
        try:
            placeholder.format(kind="email")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"placeholder may only use {{kind}}: {exc}") from None
        self.action = action
        self.kinds = tuple(kinds)
        self.placeholder = placeholder
        self.min_holdback = MASK_HOLDBACK if action == "mask" else 0

    def check(self, text: str, *, final: bool) -> Verdict:
        found = find_personal_data(text, self.kinds)
        if not final:
            # A match followed only by separators may still grow (more digits, a longer domain).
            found = [span for span in found if not _MAY_GROW.fullmatch(text, span[1])]
        if not found:
            return ALLOWED
        kinds = tuple(dict.fromkeys(kind for _, _, kind in found))
        reason = "personal data: " + ", ".join(kinds)
        if self.action == "block":
            return Verdict(False, reason, kinds)
        pieces, at = [], 0
        for start, end, kind in found:
            pieces += [text[at:start], self.placeholder.format(kind=kind)]
            at = end
        pieces.append(text[at:])
        return Verdict(True, "masked " + reason, kinds, replacement="".join(pieces))
