"""Output policy for chat answers: what the user sees during generation, and whether it stands.

A gate (`gate_for`) is fed the generated chunks of one answer and replies with actions:
`Emit` text now, `Hold` the rest back, `Cut` it short at a loop keeping the good part, or
`Retract` everything (both stop generating).
`finish()` gives the `Outcome`: "ok", "invalid" (JSON parse/schema failure; re-ask with
`reask_message`) or "moderated" (a `ModerationHook` vetoed it). Pure stdlib + jsonschema,
so it is testable without Django or a model; the hooks in their own modules (pii, profanity,
remote_moderation, guard) are loaded by name (`HOOKS`), the profanity one reading
alt-profanity-check's model only when a policy uses it.
"""

from .actions import Action, Cut, Emit, Hold, Outcome, Retract
from .extraction import ExtractionError, extract_json
from .gate import MODES, AutoGate, BufferGate, Gate, StreamGate, ToolCallGate, gate_for
from .moderation import (
    ALLOWED,
    HOOKS,
    BlocklistHook,
    HookConfigError,
    ModerationHook,
    RepetitionHook,
    Verdict,
    load_hook,
    moderate,
)
from .retry import reask_message
from .tool_calls import ToolCall, ToolSpec, reask_tool_message
from .validation import instance_errors, json_path, schema_errors

__all__ = [
    "ALLOWED",
    "HOOKS",
    "MODES",
    "Action",
    "AutoGate",
    "BlocklistHook",
    "BufferGate",
    "Cut",
    "Emit",
    "ExtractionError",
    "Gate",
    "Hold",
    "HookConfigError",
    "ModerationHook",
    "Outcome",
    "RepetitionHook",
    "Retract",
    "StreamGate",
    "ToolCall",
    "ToolCallGate",
    "ToolSpec",
    "Verdict",
    "extract_json",
    "gate_for",
    "instance_errors",
    "json_path",
    "load_hook",
    "moderate",
    "reask_message",
    "reask_tool_message",
    "schema_errors",
]
