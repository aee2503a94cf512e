"""The OpenAI chat-completions wire format: requests parsed and checked, responses built.

Every shape the OpenAI-compatible API sends is built here (the model list, a completion, a
stream chunk, usage, an error), so the views in chat/openai_api.py cannot disagree about a
field. A request this server will not serve raises OpenAIError, which carries its HTTP status
and OpenAI's error body `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from . import inputs
from .engine.types import penalty_errors
from .policy import schema_errors
from .policy_store import PolicyOverride

MAX_BODY_BYTES = 1024 * 1024
MAX_MESSAGES = 200
# All messages together, in characters: far past the model's context, and a bound on the work
# of fitting a long conversation into it (the oldest turns are dropped two at a time).
MAX_CONVERSATION_CHARS = 64 * 1024
MAX_STOP_STRINGS = 4  # as OpenAI
MAX_STOP_CHARS = 100
MAX_POLICY_SLUG = 50
JSON_OBJECT_SCHEMA = {"type": "object"}

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


# A turn refused by chat/services.py (TurnError code) as OpenAI's status, type, param, code.
_TURN_ERRORS = {
    "unknown_policy": (404, "invalid_request_error", "model", "model_not_found"),
    "prompt_too_long": (400, "invalid_request_error", "messages", "context_length_exceeded"),
    "rate_limited": (429, "requests", None, "rate_limit_exceeded"),
    "model_loading": (503, "server_error", None, "model_loading"),
    "server_restarting": (503, "server_error", None, "server_restarting"),
    "queue_full": (503, "server_error", None, "queue_full"),
    "storage_failed": (503, "server_error", None, "storage_failed"),
    "model_error": (500, "server_error", None, "model_error"),
}


def turn_error(code: str, message: str) -> OpenAIError:
    """The OpenAI error for a chat/services.py TurnError (or an `error` event) `code`."""
    status, kind, param, openai_code = _TURN_ERRORS.get(
        code, (400, "invalid_request_error", None, code)
    )
    return OpenAIError(status, message, type=kind, param=param, code=openai_code)


# -- requests -------------------------------------------------------------------------


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


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _number(body: dict, name: str, low: float, high: float, *, low_open: bool = False):
    value = body.get(name)
    if value is None:
        return None
    if not _is_number(value) or value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise bad_request(f"{name} must be a number in {bracket}{low}, {high}]", name)
    return float(value)


def _penalties(body: dict) -> dict[str, float]:
    """OpenAI's frequency/presence penalties and vLLM's repetition_penalty, when given."""
    given = {name: body[name] for name in _PENALTY_FIELDS if body.get(name) is not None}
    for name, problem in penalty_errors(**given).items():
        raise bad_request(f"{name} {problem}", name)
    return {name: float(value) for name, value in given.items()}


# no_repeat_ngram_size stays a policy setting: no OpenAI-style client sends it.
_PENALTY_FIELDS = ("frequency_penalty", "presence_penalty", "repetition_penalty")


def _content(message: dict, index: int) -> str:
    """A message's text: a string, or a list of text parts (images and audio are refused)."""
    param = f"messages[{index}].content"
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise bad_request("only text content parts are supported", param)
            if not isinstance(part.get("text"), str):
                raise bad_request("a text content part needs a string `text`", param)
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request("content must be a string or a list of text parts", param)


def _messages(body: dict) -> tuple[str | None, list[dict], str]:
    """(system prompt or None, earlier turns, last user text) from `messages`."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"at most {MAX_MESSAGES} messages", "messages")
    system: list[str] = []
    turns: list[dict] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request("each message must be an object", f"messages[{index}]")
        role = message.get("role")
        if (
            role in ("tool", "function")
            or message.get("tool_calls")
            or message.get("function_call")
        ):
            raise bad_request("tools are not supported", f"messages[{index}]", "unsupported")
        if role not in ("system", "developer", "user", "assistant"):
            raise bad_request(
                "role must be system, developer, user or assistant", f"messages[{index}].role"
            )
        text = _content(message, index)
        if role in ("system", "developer"):
            system.append(text)
        else:
            turns.append({"role": role, "content": text})
    total = sum(len(t["content"]) for t in turns) + sum(len(text) for text in system)
    if total > MAX_CONVERSATION_CHARS:
        raise bad_request(
            f"the messages hold {total} characters; the limit is {MAX_CONVERSATION_CHARS}",
            "messages",
            "context_length_exceeded",
        )
    if not turns or turns[-1]["role"] != "user" or not turns[-1]["content"].strip():
        raise bad_request("the last message must be a non-empty user message", "messages")
    return ("\n\n".join(system) if system else None), turns[:-1], turns[-1]["content"]


def _model(body: dict, model_name: str) -> tuple[str, str | None]:
    """(model, policy slug or None for the default): `<name>` or `<name>:<policy>`."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model must be a non-empty string", "model")
    slug = None
    if model != model_name:
        base, _, slug = model.partition(":")
        if base != model_name or not slug or len(slug) > MAX_POLICY_SLUG:
            raise OpenAIError(
                404,
                f"The model `{model[:200]}` does not exist; GET /v1/models lists them",
                param="model",
                code="model_not_found",
            )
    policy = body.get("policy")  # our extra body field; it wins over the model's suffix
    if policy is not None:
        if not isinstance(policy, str) or not policy or len(policy) > MAX_POLICY_SLUG:
            raise bad_request("policy must be a policy slug", "policy")
        slug = policy
    return model, slug


def _unsupported(body: dict) -> None:
    """OpenAI features this server does not offer: a clear 400 rather than a silent ignore."""
    n = body.get("n")
    if n is not None and n != 1 or isinstance(n, bool) or isinstance(n, float):
        raise bad_request("only n=1 is supported", "n", "unsupported")
    for name in ("tools", "functions"):
        if body.get(name):
            raise bad_request("tools are not supported", name, "unsupported")
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in (None, "none"):
            raise bad_request("tools are not supported", name, "unsupported")
    if body.get("logprobs") not in (None, False):
        raise bad_request("logprobs are not supported", "logprobs", "unsupported")
    if body.get("top_logprobs") is not None:
        raise bad_request("logprobs are not supported", "top_logprobs", "unsupported")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad_request("only text output is supported", "modalities", "unsupported")


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)
    ):
        raise bad_request(
            f"stop must be a string or a list of at most {MAX_STOP_STRINGS} non-empty "
            f"strings of at most {MAX_STOP_CHARS} characters",
            "stop",
        )
    return tuple(stops)


def _max_tokens(body: dict) -> int | None:
    found = []
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise bad_request(f"{name} must be a positive integer", name)
        found.append(value)
    return min(found) if found else None


def _response_format(body: dict) -> tuple[dict | None, bool]:
    """(schema or None, strict) from `response_format`."""
    response_format = body.get("response_format")
    if response_format is None:
        return None, False
    if not isinstance(response_format, dict):
        raise bad_request("response_format must be an object", "response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None, False
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA, False
    if kind != "json_schema":
        raise bad_request(
            "response_format.type must be text, json_object or json_schema",
            "response_format.type",
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise bad_request(
            "response_format.json_schema must be an object with a name and a schema",
            "response_format.json_schema",
        )
    schema = spec.get("schema", {})
    problems = schema_errors(schema) if isinstance(schema, dict) else ["must be an object"]
    if problems:
        raise bad_request(
            f"not a valid JSON Schema: {problems[0]}", "response_format.json_schema.schema"
        )
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request("strict must be a boolean", "response_format.json_schema.strict")
    return schema, bool(strict)


def input_error(exc: inputs.InputError) -> OpenAIError:
    """A request refused at the input edge (chat/inputs.py) as OpenAI's error."""
    if exc.code == inputs.TOO_LARGE:
        return OpenAIError(413, f"the request body is limited to {MAX_BODY_BYTES} bytes")
    if exc.code == inputs.BAD_JSON:
        return bad_request(f"the body {exc.message}")
    return bad_request(exc.message, exc.param)


def parse_chat_request(body: bytes, *, model_name: str, max_prompt_chars: int) -> ChatRequest:
    """Check a `POST /v1/chat/completions` body; OpenAIError says what is wrong with it."""
    try:
        data = inputs.json_parse(body, limit=MAX_BODY_BYTES)
    except inputs.InputError as exc:
        raise input_error(exc) from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    model, policy = _model(data, model_name)
    _unsupported(data)
    system, history, text = _messages(data)
    if len(text) > max_prompt_chars:
        raise bad_request(
            f"the last message is {len(text)} characters; the limit is {max_prompt_chars}",
            "messages",
            "context_length_exceeded",
        )
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("stream must be a boolean", "stream")
    options = data.get("stream_options")
    if options is not None and (
        not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool)
    ):
        raise bad_request('stream_options must be {"include_usage": <bool>}', "stream_options")
    seed = data.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad_request("seed must be an integer", "seed")
    schema, strict = _response_format(data)
    override = PolicyOverride(
        system_prompt=system,
        schema=schema,
        strict=strict,
        stop_strings=_stop(data),
        max_new_tokens=_max_tokens(data),
        temperature=_number(data, "temperature", 0, 2),
        top_p=_number(data, "top_p", 0, 1, low_open=True),
        penalties=_penalties(data),
    )
    return ChatRequest(
        model=model,
        policy=policy,
        text=text,
        history=history,
        override=override,
        stream=bool(stream),
        include_usage=bool(stream and options and options.get("include_usage")),
    )


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


def answer_of(done: dict, *, shown: str) -> Answer:
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
    if done["json"] is not None and not shown:
        text = json.dumps(done["json"], ensure_ascii=False)
        return Answer(text, text, None, finish, native)
    text = done["text"]
    rest = text[len(shown) :] if text.startswith(shown) else ""
    return Answer(text, rest, None, finish, native)


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
