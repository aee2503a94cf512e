"""`POST /v1/chat/completions`'s body as pydantic models, in the manner of vLLM's
(vllm/entrypoints/openai/protocol.py), and the limits the server sets on it.

parsing.py checks a body against them and the server's settings; replies.py holds what goes back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ...engine.sampling_params import SamplingChanges, SamplingParams, penalty_errors
from ...policy import ToolSpec, schema_errors
from ...policy.tool_calls import call_text, result_text
from ...stores.policy_store import PolicyOverride

MAX_BODY_BYTES = 1024 * 1024
MAX_MESSAGES = 200
# All messages together, in characters: far past the model's context, and a bound on the work
# of fitting a long conversation into it (the oldest turns are dropped two at a time).
MAX_CONVERSATION_CHARS = 64 * 1024
MAX_STOP_STRINGS = 4  # as OpenAI
MAX_STOP_CHARS = 100
MAX_POLICY_SLUG = 50
JSON_OBJECT_SCHEMA = {"type": "object"}
# Tools: each function's parameters schema, and all of them together, as compact JSON. Far
# past what a 135M model's context can hold; a bound on the work of compiling their grammar.
MAX_TOOLS = 64
MAX_TOOL_SCHEMA_CHARS = 16 * 1024
MAX_TOOLS_CHARS = 64 * 1024
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name

# The native (wire protocol) finish reasons as OpenAI's; see `answer_of` for moderated/invalid.


# -- requests -------------------------------------------------------------------------
#
# The body of `POST /v1/chat/completions` as pydantic models, in the manner of vLLM's
# (vllm/entrypoints/openai/protocol.py): types, ranges and shapes are declared on the fields;
# what needs more than one field or the server's settings (the model name, the conversation's
# size, a schema's validity) is checked in `parse_chat_request`. Unknown fields are ignored, as
# OpenAI's clients send many. A ValidationError becomes OpenAI's 400 through `_validation_error`.


class _Body(BaseModel):
    # strict: JSON's true is not 1, "1" is not a number; unknown fields are ignored.
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class ChatMessage(_Body):
    role: Any = None  # checked in `_check`, which says which roles there are
    content: Any = None  # a string, or a list of text parts (images and audio are refused)
    tool_calls: Any = None  # an assistant's: [{"id", "type": "function", "function": {...}}]
    tool_call_id: Any = None  # a tool result's: the id of the call it answers
    function_call: Any = None

    @model_validator(mode="after")
    def _check(self):
        if self.role == "function" or self.function_call:
            raise _unsupported("the legacy function_call is not supported; use tools")
        if self.role not in ROLES:
            raise _problem("role must be system, developer, user, assistant or tool", field="role")
        if self.tool_calls is not None:
            if self.role != "assistant":
                raise _problem("only an assistant message has tool_calls", field="tool_calls")
            self._check_tool_calls()
        if self.role == "tool" and (
            not isinstance(self.tool_call_id, str) or not self.tool_call_id
        ):
            raise _problem("a tool message needs its tool_call_id", field="tool_call_id")
        content = self.content
        if content is not None and not isinstance(content, (str, list)):
            raise _problem("content must be a string or a list of text parts", field="content")
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict) or part.get("type") != "text":
                raise _problem("only text content parts are supported", field="content")
            if not isinstance(part.get("text"), str):
                raise _problem("a text content part needs a string `text`", field="content")
        return self

    def _check_tool_calls(self) -> None:
        calls = self.tool_calls
        if not isinstance(calls, list):
            raise _problem("tool_calls must be a list", field="tool_calls")
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if (
                not isinstance(function, dict)
                or not isinstance(call.get("id"), str)
                or call.get("type", "function") != "function"
                or not isinstance(function.get("name"), str)
                or not isinstance(function.get("arguments", ""), str)
            ):
                raise _problem(
                    'each tool call must be {"id", "type": "function", "function": '
                    '{"name", "arguments": <JSON string>}}',
                    field="tool_calls",
                )

    @property
    def text(self) -> str:
        content = self.content
        if isinstance(content, list):
            return "".join(part["text"] for part in content)
        return content or ""

    @property
    def call_ids(self) -> list[str]:
        return [call["id"] for call in self.tool_calls or ()]

    def model_text(self) -> str:
        """What the model reads for this message: a tool result wrapped as one, an assistant's
        calls written back as it would write them (tool_calls.py's format)."""
        if self.role == "tool":
            return result_text(self.text)
        parts = [self.text] if self.text else []
        for call in self.tool_calls or ():
            function = call["function"]
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except ValueError:
                arguments = function.get("arguments")
            parts.append(call_text(function["name"], arguments))
        return "\n".join(parts)


class JsonSchemaFormat(_Body):
    name: StrictStr
    schema_: Any = Field(default_factory=dict, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Body):
    include_usage: StrictBool = False


_PENALTY_FIELDS = ("frequency_penalty", "presence_penalty", "repetition_penalty")
_Number = Annotated[float, Field(allow_inf_nan=False)]
_Positive = Annotated[int, Field(ge=1)]
_Slug = Annotated[str, Field(min_length=1, max_length=MAX_POLICY_SLUG)]
_Stop = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class ChatCompletionRequest(_Body):
    """OpenAI's chat-completions request, as far as this server reads it.

    Fields are checked in the order declared, and the first problem is the one reported, so the
    order is the one a client fixes its request in: the model, unsupported features, the
    messages, then the sampling parameters. `model_validate` needs the context `model_name` and
    `max_prompt_chars` (the server's settings).
    """

    model: Annotated[str, Field(min_length=1)]
    policy: _Slug | None = None  # ours: a policy slug; it wins over the model's suffix
    n: Any = None
    functions: Any = None
    function_call: Any = None
    tools: Any = None  # checked in `_tool_spec`, beside the messages' calls
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    logprobs: Any = None
    top_logprobs: Any = None
    modalities: Any = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    seed: StrictInt | None = None
    response_format: ResponseFormat | None = None
    stop: _Stop | Annotated[list[_Stop], Field(max_length=MAX_STOP_STRINGS)] | None = None
    max_completion_tokens: _Positive | None = None
    max_tokens: _Positive | None = None
    temperature: Annotated[_Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[_Number, Field(gt=0, le=1)] | None = None
    # OpenAI's frequency/presence penalties and vLLM's repetition_penalty, in the engine's ranges
    # (`penalty_errors`). the n-gram ban stays a policy setting: no OpenAI client sends it.
    frequency_penalty: Any = None
    presence_penalty: Any = None
    repetition_penalty: Any = None

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str, info: ValidationInfo) -> str:
        """`<name>` or `<name>:<policy>`; anything else is OpenAI's 404 model_not_found."""
        name = cast(dict, info.context)["model_name"]
        if model != name:
            base, _, slug = model.partition(":")
            if base != name or not slug or len(slug) > MAX_POLICY_SLUG:
                raise PydanticCustomError(
                    "model_not_found",
                    "The model `{model}` does not exist; GET /v1/models lists them",
                    {"model": model[:200]},
                )
        return model

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n):
        if n is not None and n != 1 or isinstance(n, (bool, float)):
            raise _unsupported("only n=1 is supported")
        return n

    @field_validator("functions")
    @classmethod
    def _no_functions(cls, value):
        if value:
            raise _unsupported("the legacy functions are not supported; use tools")
        return value

    @field_validator("function_call")
    @classmethod
    def _no_function_call(cls, value):
        if value not in (None, "none"):
            raise _unsupported("the legacy function_call is not supported; use tool_choice")
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value):
        if value not in (None, False):
            raise _unsupported("logprobs are not supported")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value):
        if value is not None:
            raise _unsupported("logprobs are not supported")
        return value

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value):
        if value is not None and value != ["text"]:
            raise _unsupported("only text output is supported")
        return value

    @field_validator("messages")
    @classmethod
    def _fits(cls, messages: list[ChatMessage], info: ValidationInfo) -> list[ChatMessage]:
        """Bounded in size, and ending with the user's prompt."""
        total = sum(len(m.text) for m in messages)
        if total > MAX_CONVERSATION_CHARS:
            raise _too_long(
                f"the messages hold {total} characters; the limit is {MAX_CONVERSATION_CHARS}"
            )
        turns = [m for m in messages if m.role in ("user", "assistant", "tool")]
        if (
            not turns
            or turns[-1].role == "assistant"
            or (turns[-1].role == "user" and not turns[-1].text.strip())
        ):
            raise _problem("the last message must be a non-empty user or tool message")
        limit, text = cast(dict, info.context)["max_prompt_chars"], turns[-1].text
        if len(text) > limit:
            raise _too_long(f"the last message is {len(text)} characters; the limit is {limit}")
        return messages

    @field_validator("response_format")
    @classmethod
    def _valid_schema(cls, response_format: ResponseFormat | None) -> ResponseFormat | None:
        if response_format is None or response_format.type != "json_schema":
            return response_format
        spec = response_format.json_schema
        if spec is None:
            raise _problem(
                "response_format.json_schema must be an object with a name and a schema",
                field="json_schema",
            )
        schema = spec.schema_
        problems = schema_errors(schema) if isinstance(schema, dict) else ["must be an object"]
        if problems:
            raise _problem(f"not a valid JSON Schema: {problems[0]}", field="json_schema.schema")
        return response_format

    @field_validator(*_PENALTY_FIELDS)
    @classmethod
    def _penalty_in_range(cls, value, info: ValidationInfo):
        if value is not None:
            for problem in penalty_errors(**{str(info.field_name): value}).values():
                raise _problem(f"{info.field_name} {problem}")
        return value

    def sampling_changes(self) -> SamplingChanges:
        """What this request changes of its policy's SamplingParams, built here at the edge as
        vLLM's `to_sampling_params` (the policy they change is known when the turn is prepared).
        Every field named as a SamplingParams field replaces the policy's."""
        stop = self.stop
        max_tokens = [t for t in (self.max_completion_tokens, self.max_tokens) if t is not None]
        return SamplingChanges(
            replaced={
                name: value
                for name in _SAMPLING_FIELDS
                if (value := getattr(self, name)) is not None
            },
            stop_strings=() if stop is None else (stop,) if isinstance(stop, str) else tuple(stop),
            max_new_tokens=min(max_tokens) if max_tokens else None,
        )


# The request's fields named as SamplingParams fields (temperature, top_p, seed, the penalties).
_SAMPLING_FIELDS = tuple(
    f.name for f in fields(SamplingParams) if f.name in ChatCompletionRequest.model_fields
)


ROLES = ("system", "developer", "user", "assistant", "tool")


# Our own checks' errors: `field` names what lies below the field that raised it (a message's
# `role`). _validation_error turns them into OpenAI's 400, with `code` when OpenAI has one.
def _problem(message: str, *, field: str = "", code: str | None = None) -> PydanticCustomError:
    return PydanticCustomError("problem", message, {"field": field, "code": code})


def _unsupported(message: str) -> PydanticCustomError:
    return _problem(message, code="unsupported")


def _too_long(message: str) -> PydanticCustomError:
    return _problem(message, code="context_length_exceeded")


@dataclass(frozen=True)
class ChatRequest:
    """A checked `POST /v1/chat/completions` body, as the chat turn needs it.

    `text` is the last user message; `history` the user and assistant turns before it;
    system (and developer) messages become the policy's system prompt in `override`; the
    decoding settings are `sampling`, apart.
    """

    model: str
    policy: str | None
    text: str
    history: list[dict]
    override: PolicyOverride
    sampling: SamplingChanges
    stream: bool
    include_usage: bool
    tools: ToolSpec | None = None  # the functions the answer may call (tool_choice not "none")
