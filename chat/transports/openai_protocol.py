"""The OpenAI chat-completions wire format: requests as pydantic models, responses built.

Every shape the OpenAI-compatible API sends is built here (the model list, a completion, a
stream chunk, usage, an error), so the views in chat/transports/openai_api.py cannot disagree about a
field. A request this server will not serve raises OpenAIError, which carries its HTTP status
and OpenAI's error body `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..engine.sampling_params import penalty_errors
from ..policy import ToolSpec, schema_errors
from ..policy.tool_calls import EMPTY_PARAMETERS, call_text, parse_calls, result_text
from ..policy.validation import unresolvable_refs
from ..protocol import inputs
from ..protocol.errors import error_code
from ..stores.policy_store import PolicyOverride

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


class OpenAIError(Exception):
    """A request refused in OpenAI's shape: `status` and the body `error_body` gives."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def turn_error(code: str, message: str) -> OpenAIError:
    """The OpenAI error for a refused turn's (or an `error` event's) `code`: its status, type,
    param and OpenAI code from the one table in chat/protocol/errors.py."""
    known = error_code(code)
    return OpenAIError(
        known.status, message, type=known.openai_type, param=known.param, code=known.openai
    )


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

    @property
    def sampling(self) -> dict[str, float | int]:
        """The SamplingParams fields this request sets (engine/sampling_params.py)."""
        given: dict[str, float | int] = {
            name: float(value)
            for name in ("temperature", "top_p", *_PENALTY_FIELDS)
            if (value := getattr(self, name)) is not None
        }
        if self.seed is not None:
            given["seed"] = self.seed
        return given


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
    system (and developer) messages become the policy's system prompt in `override`.
    """

    model: str
    policy: str | None
    text: str
    history: list[dict]
    override: PolicyOverride
    stream: bool
    include_usage: bool
    tools: ToolSpec | None = None  # the functions the answer may call (tool_choice not "none")


def input_error(exc: inputs.InputError) -> OpenAIError:
    """A request refused at the input edge (chat/protocol/inputs.py) as OpenAI's error."""
    if exc.code == inputs.TOO_LARGE:
        return OpenAIError(413, f"the request body is limited to {MAX_BODY_BYTES} bytes")
    if exc.code == inputs.BAD_JSON:
        return bad_request(f"the body {exc.message}")
    return bad_request(exc.message, exc.param)


def json_body(body: bytes) -> dict:
    """The request body as a JSON object, or OpenAIError: the one place /v1 reads raw JSON,
    through the input edge (size, depth scanned before parsing, clean text in every string)."""
    try:
        data = inputs.json_parse(body, limit=MAX_BODY_BYTES)
    except inputs.InputError as exc:
        raise input_error(exc) from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    return data


# What a field's own validation error says, by its param with list indexes as [].
_FIELD_MESSAGES = {
    "model": "model must be a non-empty string",
    "messages": "messages must be a non-empty list",
    "messages[]": "each message must be an object",
    "stream": "stream must be a boolean",
    "stream_options": 'stream_options must be {"include_usage": <bool>}',
    "seed": "seed must be an integer",
    "response_format": "response_format must be an object",
    "response_format.type": "response_format.type must be text, json_object or json_schema",
    "response_format.json_schema": (
        "response_format.json_schema must be an object with a name and a schema"
    ),
    "response_format.json_schema.name": (
        "response_format.json_schema must be an object with a name and a schema"
    ),
    "response_format.json_schema.strict": "strict must be a boolean",
    "stop": (
        f"stop must be a string or a list of at most {MAX_STOP_STRINGS} non-empty "
        f"strings of at most {MAX_STOP_CHARS} characters"
    ),
    "max_completion_tokens": "max_completion_tokens must be a positive integer",
    "max_tokens": "max_tokens must be a positive integer",
    "temperature": "temperature must be a number in [0, 2]",
    "top_p": "top_p must be a number in (0, 1]",
    "parallel_tool_calls": "parallel_tool_calls must be a boolean",
    "policy": "policy must be a policy slug",
}


def _param(loc: tuple) -> str:
    """OpenAI's `param` for a pydantic error location: messages[0].content; union branch names
    (pydantic's "str", "list[...]") and what lies below them are left out."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part in _FIELD_NAMES:
            param += f".{part}" if param else part
        else:
            break
    return param


def _validation_error(exc: ValidationError) -> OpenAIError:
    """The first problem pydantic found, as OpenAI's error with the field at fault as `param`."""
    error = exc.errors(include_url=False)[0]
    param = _param(error["loc"])
    kind = error["type"]
    if kind == "model_not_found":
        return OpenAIError(404, error["msg"], param="model", code="model_not_found")
    if kind == "problem":
        context = error["ctx"]
        param = ".".join(p for p in (param, context["field"]) if p)
        return bad_request(error["msg"], param or None, context["code"])
    pattern = re.sub(r"\[\d+\]", "[]", param)
    if pattern == "messages" and kind == "too_long":
        return bad_request(f"at most {MAX_MESSAGES} messages", param)
    message = _FIELD_MESSAGES.get(pattern) or f"{param or 'the body'}: {error['msg']}"
    return bad_request(message, param or None)


def parse_chat_request(body: bytes, *, model_name: str, max_prompt_chars: int) -> ChatRequest:
    """Check a `POST /v1/chat/completions` body; OpenAIError says what is wrong with it."""
    data = json_body(body)
    try:
        request = ChatCompletionRequest.model_validate(
            data, context={"model_name": model_name, "max_prompt_chars": max_prompt_chars}
        )
    except ValidationError as exc:
        raise _validation_error(exc) from None
    system = [m.text for m in request.messages if m.role in ("system", "developer")]
    turns = _turns(request.messages)
    tools = _tool_spec(request)
    schema = _response_format(request.response_format)
    if tools is not None and schema is not None:
        raise _tool_error("response_format asks for JSON and tools for calls: use one", "tools")
    limit = max_prompt_chars + MAX_TOOL_RESULT_WRAPPER
    if len(turns[-1]["content"]) > limit:  # the tool results of one turn, wrapped together
        raise bad_request(
            f"the last turn is {len(turns[-1]['content'])} characters; the limit is {limit}",
            "messages",
            "context_length_exceeded",
        )
    stop = request.stop
    max_tokens = [t for t in (request.max_completion_tokens, request.max_tokens) if t is not None]
    override = PolicyOverride(
        system_prompt="\n\n".join(system) if system else None,
        schema=schema,
        stop_strings=() if stop is None else (stop,) if isinstance(stop, str) else tuple(stop),
        max_new_tokens=min(max_tokens) if max_tokens else None,
        sampling=request.sampling,
        tools=tools,
    )
    options = request.stream_options
    model = request.model
    return ChatRequest(
        model=model,
        policy=request.policy or (model.partition(":")[2] if model != model_name else None),
        text=turns[-1]["content"],
        history=turns[:-1],
        override=override,
        stream=bool(request.stream),
        include_usage=bool(request.stream and options and options.include_usage),
        tools=tools,
    )


# Room for the `<tool_response>` wrappers of the last turn's results beside the prompt limit.
MAX_TOOL_RESULT_WRAPPER = 1024


def _turns(messages: list[ChatMessage]) -> list[dict]:
    """The user and assistant turns the model reads. Tool results are user turns (the model
    knows no tool role), joined with the user message beside them, and each must answer a
    call an earlier assistant message made."""
    turns: list[dict] = []
    called: set[str] = set()
    joins = False  # the last turn holds a tool result: the next user turn goes into it
    for index, message in enumerate(messages):
        if message.role in ("system", "developer"):
            continue
        if message.role == "tool" and message.tool_call_id not in called:
            raise _tool_error(
                f"tool_call_id {message.tool_call_id[:100]!r} answers no earlier tool call",
                f"messages[{index}].tool_call_id",
            )
        called.update(message.call_ids)
        role = "assistant" if message.role == "assistant" else "user"
        text = message.model_text()
        if (
            turns
            and role == "user"
            and turns[-1]["role"] == "user"
            and (joins or message.role == "tool")
        ):
            turns[-1]["content"] += "\n" + text
            joins = True
            continue
        turns.append({"role": role, "content": text})
        joins = message.role == "tool"
    return turns


def _tool_error(message: str, param: str) -> OpenAIError:
    known = error_code("bad_tools")
    return OpenAIError(
        known.status, message, type=known.openai_type, param=param, code=known.openai
    )


def _tool_spec(request: ChatCompletionRequest) -> ToolSpec | None:
    """The request's tools as the turn needs them, or None without tools or with tool_choice
    "none"; a tool the server cannot serve is a 400 naming it."""
    tools, choice = request.tools, request.tool_choice
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise _tool_error("tools must be a list", "tools")
    if len(tools) > MAX_TOOLS:
        raise _tool_error(f"at most {MAX_TOOLS} tools", "tools")
    if len(json.dumps(tools, separators=(",", ":"))) > MAX_TOOLS_CHARS:
        raise _tool_error(f"the tools are limited to {MAX_TOOLS_CHARS} characters of JSON", "tools")
    functions = [_function(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    names = [name for name, _, _ in functions]
    if len(set(names)) != len(names):
        raise _tool_error("two tools have the same name", "tools")
    if choice is None:
        choice = "auto" if functions else "none"
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise _tool_error(
                'tool_choice must be none, auto, required or {"type": "function", '
                '"function": {"name": ...}}',
                "tool_choice",
            )
        if name not in names:
            raise _tool_error(
                f"tool_choice names {name[:100]!r}, which is not in tools", "tool_choice"
            )
        choice = name
    elif choice not in ("none", "auto", "required"):
        raise _tool_error(
            'tool_choice must be none, auto, required or {"type": "function", '
            '"function": {"name": ...}}',
            "tool_choice",
        )
    elif choice == "required" and not functions:
        raise _tool_error('tool_choice "required" needs tools', "tool_choice")
    if choice == "none" or not functions:
        return None
    parallel = request.parallel_tool_calls is not False
    return ToolSpec(functions=tuple(functions), choice=choice, parallel=parallel)


def _function(tool: object, param: str) -> tuple[str, str, dict]:
    """(name, description, parameters) of one checked `tools` entry."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if (
        not isinstance(tool, dict)
        or tool.get("type") != "function"
        or not isinstance(function, dict)
    ):
        raise _tool_error('a tool must be {"type": "function", "function": {...}}', param)
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise _tool_error(
            "a function's name must be 1 to 64 letters, digits, _ or -", f"{param}.function.name"
        )
    description = function.get("description") or ""
    if not isinstance(description, str):
        raise _tool_error("description must be a string", f"{param}.function.description")
    parameters = function.get("parameters")
    where = f"{param}.function.parameters"
    if parameters is None:
        return name, description, EMPTY_PARAMETERS
    if not isinstance(parameters, dict):
        raise _tool_error("parameters must be a JSON Schema object", where)
    if len(json.dumps(parameters, separators=(",", ":"))) > MAX_TOOL_SCHEMA_CHARS:
        raise _tool_error(
            f"a function's parameters are limited to {MAX_TOOL_SCHEMA_CHARS} characters of JSON",
            where,
        )
    problems = schema_errors(parameters)
    if problems:
        raise _tool_error(f"not a valid JSON Schema: {problems[0]}", where)
    if parameters.get("type", "object") != "object":
        raise _tool_error("parameters must describe a JSON object (type: object)", where)
    unresolved = unresolvable_refs(parameters)
    if unresolved:
        raise _tool_error(f"$ref {unresolved[0][:100]!r} does not resolve within the schema", where)
    return name, description, parameters


def _response_format(response_format: ResponseFormat | None) -> dict | None:
    """The schema a checked `response_format` asks for, or None. `strict` changes nothing:
    every schema binds (PolicyOverride)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return JSON_OBJECT_SCHEMA
    spec = response_format.json_schema
    assert spec is not None  # a json_schema format without one was refused by _valid_schema
    return spec.schema_


_FIELD_NAMES = {
    name
    for model in (
        ChatCompletionRequest,
        ChatMessage,
        ResponseFormat,
        JsonSchemaFormat,
        StreamOptions,
    )
    for field_name, field in model.model_fields.items()
    for name in (field_name, field.alias)
    if name
}


# -- responses ------------------------------------------------------------------------


def model_object(model_id: str, *, created: int, description: str = "") -> dict:
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "chat",
        "description": description,
    }


def model_list(models: list[dict]) -> dict:
    return {"object": "list", "data": models}


def usage(*, prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def usage_of(done: dict) -> dict:
    """Usage from a `done` event; a cached answer counts the tokens it took when first made."""
    m = done["metrics"]
    completion = (m.get("cached_new_tokens") if done["cached"] else m.get("new_tokens")) or 0
    return usage(prompt_tokens=m.get("prompt_tokens") or 0, completion_tokens=completion)


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
    tool_calls: list[dict] | None = None  # OpenAI's message.tool_calls


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


def tool_calls(value: dict) -> list[dict]:
    """OpenAI's `tool_calls` for a stored answer's calls, each with a fresh `call_` id (a cached
    answer's calls are new calls)."""
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {
                "name": call["name"],
                "arguments": json.dumps(call["arguments"], ensure_ascii=False),
            },
        }
        for call in value["tool_calls"]
    ]


def tool_call_deltas(calls: list[dict]) -> list[dict]:
    """The deltas that stream `calls` as OpenAI does: each call's index, id and name first,
    then its arguments."""
    deltas = []
    for index, call in enumerate(calls):
        function = call["function"]
        head = {"name": function["name"], "arguments": ""}
        deltas.append(
            {
                "tool_calls": [
                    {"index": index, "id": call["id"], "type": "function", "function": head}
                ]
            }
        )
        deltas.append(
            {"tool_calls": [{"index": index, "function": {"arguments": function["arguments"]}}]}
        )
    return deltas


def completion(
    *, completion_id: str, created: int, model: str, answer: Answer, usage: dict, done: dict
) -> dict:
    """A `chat.completion` (stream false)."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": answer.content,
                    "refusal": answer.refusal,
                    **({"tool_calls": answer.tool_calls} if answer.tool_calls else {}),
                },
                "logprobs": None,
                "finish_reason": answer.finish_reason,
                "native_finish_reason": answer.native_finish_reason,
            }
        ],
        "usage": usage,
        # Ours, beside OpenAI's fields: the stored answer and whether the cache served it.
        "message_id": done["message"],
        "cached": done["cached"],
        "policy": done["policy"],
    }


def chunk(
    *,
    completion_id: str,
    created: int,
    model: str,
    delta: dict | None = None,
    finish_reason: str | None = None,
    native_finish_reason: str | None = None,
    usage: dict | None = None,
) -> dict:
    """A `chat.completion.chunk`: a delta, or the final one with its finish_reason; with
    `usage` and no delta it is the usage chunk (`stream_options.include_usage`), whose
    choices are empty."""
    choices = []
    if delta is not None:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        if native_finish_reason is not None:
            choice["native_finish_reason"] = native_finish_reason
        choices.append(choice)
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
        "usage": usage,
    }
