"""OpenAI's error object, `{"error": {"message", "type", "param", "code"}}`, and the exception
that carries it with its HTTP status: every refusal on `/v1` is one of these."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from pydantic import BaseModel

from ...protocol import inputs
from ...protocol.errors import error_code
from .requests import MAX_BODY_BYTES


class ErrorDetail(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


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
        self.headers: dict[str, str] = {}

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param=None, code=None) -> dict:
    """The wire body: every field present, `param` and `code` null when there is none."""
    detail = ErrorDetail(message=message, type=type, param=param, code=code)
    return ErrorBody(error=detail).model_dump()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def turn_error(code: str, message: str, resets_at: str | None = None) -> OpenAIError:
    """The OpenAI error for a refused turn's (or an `error` event's) `code`: its status, type,
    param and OpenAI code from the one table in chat/protocol/errors.py. A spent budget
    (`resets_at` given) says when it resets, and that retrying sooner is pointless: the openai
    package reads `x-should-retry` before its own retry rules."""
    known = error_code(code)
    error = OpenAIError(
        known.status, message, type=known.openai_type, param=known.param, code=known.openai
    )
    if resets_at is not None:
        reset = datetime.fromisoformat(resets_at.replace("Z", "+00:00"))
        wait = max(1, math.ceil((reset - datetime.now(UTC)).total_seconds()))
        error.headers = {"Retry-After": str(wait), "x-should-retry": "false"}
    elif known.retry_after is not None:  # e.g. engine_unavailable: worth a retry, not at once
        error.headers = {"Retry-After": str(known.retry_after)}
    return error


def input_error(exc: inputs.InputError) -> OpenAIError:
    """A request refused at the input edge (chat/protocol/inputs.py) as OpenAI's error."""
    if exc.code == inputs.TOO_LARGE:
        return OpenAIError(413, f"the request body is limited to {MAX_BODY_BYTES} bytes")
    if exc.code == inputs.BAD_JSON:
        return bad_request(f"the body {exc.message}")
    return bad_request(exc.message, exc.param)
