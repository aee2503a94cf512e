"""What `/v1` sends back, as pydantic models: the model list, a completion, a stream chunk, usage
and tool calls (errors are errors.py's), so the views in views.py cannot
disagree about a field.

A model's `wire()` is the JSON object sent. OpenAI sends most absent fields as null
(`system_fingerprint`, `logprobs`, a message's `refusal`), and omits a few: a message's
`tool_calls` without calls, and in a stream a delta's unset fields and a choice's
`native_finish_reason` (ours, OpenRouter's name) when there is none. `OMITTED_WHEN_NONE` names
those per model; every other field is sent, null or not.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

from ...policy import ToolSpec
from ...policy.tool_calls import parse_calls


class Reply(BaseModel):
    """A reply object: its fields in wire order; `OMITTED_WHEN_NONE` left out while None."""

    OMITTED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for name in self.OMITTED_WHEN_NONE:
            if data.get(name) is None:
                data.pop(name, None)
        return data

    def wire(self) -> dict[str, Any]:
        return self.model_dump()


# -- models ------------------------------------------------------------------------


class ModelObject(Reply):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "chat"
    description: str = ""


class ModelList(Reply):
    object: Literal["list"] = "list"
    data: list[ModelObject]


def model_object(model_id: str, *, created: int, description: str = "") -> ModelObject:
    return ModelObject(id=model_id, created=created, description=description)


def model_list(models: list[ModelObject]) -> ModelList:
    return ModelList(data=models)


# -- usage and tool calls --------------------------------------------------------------


class Usage(Reply):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def usage(*, prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def usage_of(done: dict) -> Usage:
    """Usage from a `done` event; a cached answer counts the tokens it took when first made."""
    m = done["metrics"]
    completion = (m.get("cached_new_tokens") if done["cached"] else m.get("new_tokens")) or 0
    return usage(prompt_tokens=m.get("prompt_tokens") or 0, completion_tokens=completion)


class FunctionCall(Reply):
    """A call's function; in a stream's deltas, the name first, then the arguments alone."""

    OMITTED_WHEN_NONE = frozenset({"name"})
    name: str | None = None
    arguments: str


class ToolCall(Reply):
    """OpenAI's `tool_calls` item; a stream delta's item carries its `index`, and `id` and
    `type` only in the call's first delta."""

    OMITTED_WHEN_NONE = frozenset({"index", "id", "type"})
    index: int | None = None
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCall


def tool_calls(value: dict) -> list[ToolCall]:
    """OpenAI's `tool_calls` for a stored answer's calls, each with a fresh `call_` id (a cached
    answer's calls are new calls)."""
    return [
        ToolCall(
            id=f"call_{uuid.uuid4().hex[:24]}",
            type="function",
            function=FunctionCall(
                name=call["name"], arguments=json.dumps(call["arguments"], ensure_ascii=False)
            ),
        )
        for call in value["tool_calls"]
    ]


# -- the answer ------------------------------------------------------------------------

# OpenAI's finish_reason for each of a chat turn's (`native_finish_reason` says which it was).
FINISH_REASON = {
    "eos": "stop",
    "stop_string": "stop",
    "length": "length",
    "cancelled": "stop",
    "moderated": "content_filter",
    "invalid": "stop",
    # Cut short at a loop: the answer is its good part. Deltas already streamed cannot be
    # unsent; `native_finish_reason: "cut"` and the non-streamed content say where it ends.
    "cut": "stop",
}


@dataclass(frozen=True)
class Answer:
    """What an OpenAI client is told of a finished turn.

    `content` is the whole answer (stream false); `delta` what is left to stream after the
    text already streamed as chunks.
    """

    content: str | None
    delta: str | None
    refusal: str | None
    finish_reason: str
    native_finish_reason: str
    tool_calls: list[ToolCall] | None = None  # OpenAI's message.tool_calls


def answer_of(done: dict, *, shown: str, tools: ToolSpec | None = None) -> Answer:
    """The answer of a `done` event, given the `shown` text its chunks carried.

    A structured answer that was held back (nothing shown) is its validated JSON value.
    A moderated answer ends with `content_filter` and is empty (what was streamed before
    a retraction cannot be unsent; the client must drop it). One that stayed invalid after
    its re-asks is a refusal, or the policy's fallback text when it has one.
    """
    native = done["finish_reason"]
    finish = FINISH_REASON[native]
    if native == "moderated":
        return Answer("", None, None, finish, native)
    if native == "invalid" and not done["text"]:
        reason = done.get("reason") or "it did not validate"
        return Answer(None, None, f"no valid structured answer: {reason}", finish, native)
    if tools is not None and isinstance(done["json"], dict) and done["json"].get("tool_calls"):
        # Checked calls (chat/policy/tool_calls.py). Prose beside them is the content under
        # "auto"; under "required" or a named tool the answer is its calls alone.
        prose = None if tools.required else parse_calls(done["text"])[0] or None
        return Answer(prose, prose, None, "tool_calls", native, tool_calls(done["json"]))
    if done["json"] is not None and not shown:
        text = json.dumps(done["json"], ensure_ascii=False)
        return Answer(text, text, None, finish, native)
    text = done["text"]
    rest = text[len(shown) :] if text.startswith(shown) else ""
    return Answer(text, rest, None, finish, native)


# -- a completion (stream false) -------------------------------------------------------


class Message(Reply):
    OMITTED_WHEN_NONE = frozenset({"tool_calls"})
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None
    tool_calls: list[ToolCall] | None = None


class Choice(Reply):
    index: int = 0
    message: Message
    logprobs: None = None
    finish_reason: str
    native_finish_reason: str


class ChatCompletion(Reply):
    """A `chat.completion`, with ours beside OpenAI's fields: the stored answer's id
    (`message_id`), whether the cache served it, and the policy that answered."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: None = None
    choices: list[Choice]
    usage: Usage
    message_id: Any
    cached: bool
    policy: Any


def completion(
    *, completion_id: str, created: int, model: str, answer: Answer, usage: Usage, done: dict
) -> ChatCompletion:
    """A `chat.completion` (stream false)."""
    message = Message(
        content=answer.content, refusal=answer.refusal, tool_calls=answer.tool_calls or None
    )
    choice = Choice(
        message=message,
        finish_reason=answer.finish_reason,
        native_finish_reason=answer.native_finish_reason,
    )
    return ChatCompletion(
        id=completion_id,
        created=created,
        model=model,
        choices=[choice],
        usage=usage,
        message_id=done["message"],
        cached=done["cached"],
        policy=done["policy"],
    )


# -- a stream --------------------------------------------------------------------------


class Delta(Reply):
    """What a chunk adds: only the fields it sets are sent (`{}` in the final chunk)."""

    OMITTED_WHEN_NONE = frozenset({"role", "content", "refusal", "tool_calls"})
    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None


def tool_call_deltas(calls: list[ToolCall]) -> list[Delta]:
    """The deltas that stream `calls` as OpenAI does: each call's index, id and name first,
    then its arguments."""
    deltas = []
    for index, call in enumerate(calls):
        head = FunctionCall(name=call.function.name, arguments="")
        deltas.append(
            Delta(tool_calls=[ToolCall(index=index, id=call.id, type="function", function=head)])
        )
        arguments = FunctionCall(arguments=call.function.arguments)
        deltas.append(Delta(tool_calls=[ToolCall(index=index, function=arguments)]))
    return deltas


class ChunkChoice(Reply):
    OMITTED_WHEN_NONE = frozenset({"native_finish_reason"})
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: str | None = None
    native_finish_reason: str | None = None


class ChatCompletionChunk(Reply):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: None = None
    choices: list[ChunkChoice]
    usage: Usage | None = None


def chunk(
    *,
    completion_id: str,
    created: int,
    model: str,
    delta: Delta | None = None,
    finish_reason: str | None = None,
    native_finish_reason: str | None = None,
    usage: Usage | None = None,
) -> ChatCompletionChunk:
    """A `chat.completion.chunk`: a delta, or the final one with its finish_reason; with
    `usage` and no delta it is the usage chunk (`stream_options.include_usage`), whose
    choices are empty."""
    choices = []
    if delta is not None:
        choices.append(
            ChunkChoice(
                delta=delta,
                finish_reason=finish_reason,
                native_finish_reason=native_finish_reason,
            )
        )
    return ChatCompletionChunk(
        id=completion_id, created=created, model=model, choices=choices, usage=usage
    )
