"""A `POST /v1/chat/completions` body checked: the models of requests.py, then what needs more
than one field or the server's settings (the model name, the conversation's size, a schema's
validity, the tools), as the ChatRequest a chat turn needs; or OpenAIError saying what is wrong.
"""

from __future__ import annotations

import json
import re

from pydantic import (
    ValidationError,
)

from ...policy import ToolSpec, schema_errors
from ...policy.tool_calls import EMPTY_PARAMETERS
from ...policy.validation import unresolvable_refs
from ...protocol import inputs
from ...protocol.errors import error_code
from ...stores.policy_store import PolicyOverride
from .errors import OpenAIError, bad_request, input_error
from .requests import (
    FUNCTION_NAME,
    JSON_OBJECT_SCHEMA,
    MAX_BODY_BYTES,
    MAX_MESSAGES,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_TOOL_SCHEMA_CHARS,
    MAX_TOOLS,
    MAX_TOOLS_CHARS,
    ChatCompletionRequest,
    ChatMessage,
    ChatRequest,
    JsonSchemaFormat,
    ResponseFormat,
    StreamOptions,
)


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
    override = PolicyOverride(
        system_prompt="\n\n".join(system) if system else None, schema=schema, tools=tools
    )
    options = request.stream_options
    model = request.model
    return ChatRequest(
        model=model,
        policy=request.policy or (model.partition(":")[2] if model != model_name else None),
        text=turns[-1]["content"],
        history=turns[:-1],
        override=override,
        sampling=request.sampling_changes(),
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
