"""Why an answer failed its policy, in words for the person who asked.

A `done` whose answer stayed invalid or was withdrawn carries this (`explanation`), and the
stored message keeps it, so the page shows the same after a reload. What the model wrote is
given back only for an invalid answer whose policy allows it: a withdrawn answer's text is
what moderation exists to keep from the user, whatever the policy says.
"""

from __future__ import annotations

from typing import Any

__all__ = ["explain"]

INVALID_SUMMARY = (
    "The answer did not come out in the form this policy asks for, so it is not shown as an answer."
)
MODERATED_SUMMARY = "The answer was withdrawn by this policy's checks."


def explain(
    status: str,
    *,
    policy: str,
    reason: str,
    schema: dict[str, Any] | None,
    about: str,
    raw: str,
    show_raw: bool,
) -> dict[str, str]:
    """The explanation of an answer with the gate's `status` "invalid" or "moderated".

    `policy` is the policy's slug (what Try again asks under), `reason` the gate's (a JSON
    error, a hook's reason), `about` the policy's description,
    `raw` what the model wrote, `show_raw` the policy's `show_failed_text`.
    """
    explanation = {
        "kind": status,
        "summary": MODERATED_SUMMARY if status == "moderated" else INVALID_SUMMARY,
        "expected": expected(schema, about),
        "detail": " ".join(reason.split()),
        "policy": policy,
    }
    if status == "invalid" and show_raw and raw.strip():
        explanation["raw_text"] = raw
    return explanation


def expected(schema: dict[str, Any] | None, about: str) -> str:
    """What the policy expects, from its description and its schema's own words."""
    sentences = [_sentence(about)] if about.strip() else []
    if isinstance(schema, dict):
        named = [
            _sentence(schema[key])
            for key in ("title", "description")
            if isinstance(schema.get(key), str) and schema[key].strip()
        ]
        sentences.extend(named)
        if not named:
            sentences.append(_shape(schema))
    return " ".join(sentences)


def _shape(schema: dict[str, Any]) -> str:
    required = schema.get("required")
    if schema.get("type") == "object" and isinstance(required, list) and required:
        names = [f'"{name}"' for name in required if isinstance(name, str)]
        fields = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        return f"JSON with the field{'s' if len(names) > 1 else ''} {fields}."
    return "JSON that matches the policy's schema."


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text if text.endswith((".", "!", "?")) else f"{text}."
