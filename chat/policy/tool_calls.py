"""Tool calls in the model's text: how tools are told to the model, how calls are written and
read back, and the judgement on a finished answer that may hold calls.

The format is Qwen's and Hermes's (and xgrammar's "qwen_3" structural tag, which the local
engine constrains decoding to: chat/engine/local/constrained.py):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

SmolLM2's chat template knows no tools, so they are told in the system prompt
(`tools_instruction`), with one worked example of a call (`TOOL_EXAMPLE`, a user and an
assistant turn before the chat); earlier calls are written back into assistant turns with
`call_text` and tool results into user turns with `result_text`.

`ToolSpec` is OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` as plain data; it is
also what the engine's grammar is built from (`ToolSpec.grammar`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .validation import instance_errors

__all__ = [
    "ToolSpec",
    "ToolCall",
    "tools_instruction",
    "TOOL_EXAMPLE",
    "call_text",
    "result_text",
    "parse_calls",
    "judge_calls",
    "reask_tool_message",
]

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_MAX_REASONS = 5
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)(?:" + re.escape(CALL_CLOSE) + r"|\Z)", re.S)


@dataclass(frozen=True)
class ToolSpec:
    """The tools a turn may call. `choice` is "auto", "required" or a function's name."""

    functions: tuple[tuple[str, str, dict[str, Any]], ...]  # (name, description, parameters)
    choice: str = "auto"
    parallel: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.functions)

    def parameters(self, name: str) -> dict[str, Any] | None:
        return next((p for n, _, p in self.functions if n == name), None)

    @property
    def required(self) -> bool:
        """The answer must be calls (tool_choice "required" or a named function)."""
        return self.choice != "auto"

    def as_dict(self) -> dict[str, Any]:
        """A JSON form: recorded in the policy's overrides, so it is part of the cache key."""
        return {
            "functions": [list(f) for f in self.functions],
            "choice": self.choice,
            "parallel": self.parallel,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolSpec:
        """The spec `as_dict` wrote."""
        return cls(
            functions=tuple(
                (name, description, parameters)
                for name, description, parameters in data["functions"]
            ),
            choice=data["choice"],
            parallel=data["parallel"],
        )

    def grammar(self) -> dict[str, Any]:
        """GenerationRequest.tool_grammar: OpenAI's fields, as xgrammar's builder takes them.
        `strict` is left out: xgrammar would leave a non-strict tool's arguments free."""
        tools = [
            {"type": "function", "function": {"name": name, "parameters": parameters}}
            for name, _, parameters in self.functions
        ]
        choice: Any = self.choice
        if self.required and self.choice != "required":
            choice = {"type": "function", "function": {"name": self.choice}}
        return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": self.parallel}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


def tools_instruction(spec: ToolSpec) -> str:
    """The system prompt's part that tells the model its tools and how to call them."""
    listed = "\n".join(
        json.dumps(
            {"name": name, "description": description, "parameters": parameters},
            ensure_ascii=False,
            separators=(",", ":"),
        )
        for name, description, parameters in spec.functions
    )
    call = f'{CALL_OPEN}\n{{"name": <tool name>, "arguments": <JSON object>}}\n{CALL_CLOSE}'
    if spec.choice == "auto":
        how = (
            f"If a tool can answer the user's request, reply with only a tool call, exactly:\n"
            f"{call}\nOtherwise answer in plain text."
        )
    elif spec.choice == "required":
        how = f"Reply with only a tool call, exactly:\n{call}"
    else:
        how = f"Reply with only a call of the tool {spec.choice}, exactly:\n{call}"
    return f"You have these tools:\n<tools>\n{listed}\n</tools>\n{how}"


# A 135M model calls a tool only once it has seen a call: with this example "auto" calls a
# tool for 19 of 20 prompts that need one, without it for none (`manage.py toolrate`;
# docs/openai-api.md). Its tool is no request's own, so it shows the form, not the choice.
TOOL_EXAMPLE = (
    "Look up the population of Rome.",
    f'{CALL_OPEN}\n{{"name": "lookup", "arguments": {{"query": "population of Rome"}}}}\n{CALL_CLOSE}',
)


def call_text(name: str, arguments: object) -> str:
    """One call as the model writes it (for earlier calls in the history)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def result_text(content: str) -> str:
    """A tool's result as the model reads it, in a user turn."""
    return f"<tool_response>\n{content}\n</tool_response>"


def parse_calls(text: str) -> tuple[str, list[object]]:
    """(the prose outside the calls, each call's parsed JSON or the text that did not parse)."""
    calls: list[object] = []
    for match in _CALL.finditer(text):
        body = match.group(1).strip()
        try:
            calls.append(json.loads(body))
        except ValueError:
            calls.append(body)
    prose = _CALL.sub("", text).strip()
    return prose, calls


@dataclass(frozen=True)
class Judged:
    """A finished answer's calls (empty for prose) or why they are invalid."""

    prose: str
    calls: tuple[ToolCall, ...] = ()
    error: str = ""


def judge_calls(text: str, spec: ToolSpec) -> Judged:
    """The calls in `text`, each of a listed function with arguments valid for its parameters;
    under "required" or a named function at least one; without `parallel` at most one."""
    prose, found = parse_calls(text)
    errors: list[str] = []
    calls: list[ToolCall] = []
    for index, call in enumerate(found):
        where = f"tool call {index + 1}"
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            errors.append(f'{where}: not a JSON object with a "name"')
            continue
        name, arguments = call["name"], call.get("arguments", {})
        parameters = spec.parameters(name)
        if parameters is None or (spec.required and spec.choice not in ("required", name)):
            allowed = spec.names if spec.choice in ("auto", "required") else (spec.choice,)
            errors.append(f"{where}: no tool {name!r} (tools: {', '.join(allowed)})")
            continue
        if not isinstance(arguments, dict):
            errors.append(f"{where}: arguments must be a JSON object")
            continue
        errors += [f"{where} {name}: {e}" for e in instance_errors(arguments, parameters)]
        calls.append(ToolCall(name, arguments))
    if not found and spec.required:
        errors.append("no tool call, and one is required")
    if len(found) > 1 and not spec.parallel:
        errors.append("more than one tool call, and parallel_tool_calls is false")
    if errors:
        reason = "; ".join(errors[:_MAX_REASONS])
        return Judged(prose, (), reason)
    return Judged(prose, tuple(calls))


def reask_tool_message(reason: str) -> str:
    """The follow-up turn that asks the model to fix its calls."""
    reason = " ".join(reason.split()).rstrip(".")[:300]
    return (
        f"Your previous answer was invalid: {reason}.\n"
        f"Call a tool again, exactly as {CALL_OPEN}\n"
        f'{{"name": <tool name>, "arguments": <JSON object>}}\n{CALL_CLOSE}'
    )
