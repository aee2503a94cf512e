"""The OpenAI chat-completions wire format, requests and replies alike as pydantic models.

requests.py declares `POST /v1/chat/completions`'s body, parsing.py checks it into a ChatRequest,
replies.py builds the model list, completions, stream chunks, usage and tool calls, and
errors.py OpenAI's error object with its status. The views (views.py) only
send what these build, so no two of them can disagree about a field.
"""

from .errors import OpenAIError, bad_request, error_body, input_error, turn_error
from .parsing import json_body, parse_chat_request
from .replies import (
    Answer,
    Delta,
    ModelObject,
    answer_of,
    chunk,
    completion,
    model_list,
    model_object,
    tool_call_deltas,
    tool_calls,
    usage,
    usage_of,
)
from .requests import MAX_BODY_BYTES, ChatCompletionRequest, ChatMessage, ChatRequest

__all__ = [
    "MAX_BODY_BYTES",
    "Answer",
    "ChatCompletionRequest",
    "ChatMessage",
    "ChatRequest",
    "Delta",
    "ModelObject",
    "OpenAIError",
    "answer_of",
    "bad_request",
    "chunk",
    "completion",
    "error_body",
    "input_error",
    "json_body",
    "model_list",
    "model_object",
    "parse_chat_request",
    "tool_call_deltas",
    "tool_calls",
    "turn_error",
    "usage",
    "usage_of",
]
