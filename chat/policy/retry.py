"""The follow-up user turn that asks the model to fix an invalid structured answer."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["reask_message"]

# The model is tiny: short, literal instructions work better than explanations.
_MAX_REASON = 300


def reask_message(outcome_reason: str, schema: dict[str, Any] | None) -> str:
    """Tell the model what was wrong and ask for bare JSON only, matching the schema if any."""
    reason = " ".join(outcome_reason.split()).rstrip(".") or "it was not valid JSON"
    if len(reason) > _MAX_REASON:
        reason = reason[: _MAX_REASON - 3] + "..."
    lines = [f"Your previous answer was invalid: {reason}."]
    if schema is None:
        lines.append("Reply with ONLY a valid JSON value.")
    else:
        compact = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        lines.append(f"Reply with ONLY a JSON value matching this JSON schema: {compact}")
    lines.append("No prose, no code fence.")
    return "\n".join(lines)
