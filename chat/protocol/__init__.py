"""The wire protocol (docs/protocol.md): parse client frames, serialize server events.

A contract: fields and event types may be added, never renamed or removed. Every server event
is a dataclass of chat/protocol/events.py, and `event_json` is the one serializer of the socket and
SSE (and `event_fields` the JSON API's), so two places can never disagree about a field.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from . import inputs
from .events import Error, Event, Finish, event_fields

# Far below daphne's --websocket-max-message-size (1 MiB by default), so a frame between the two
# gets `frame_too_large` and the socket stays open; past daphne's limit project/websocket_limits.py
# sends the same event, then closes with CLOSE_MESSAGE_TOO_BIG.
MAX_FRAME_BYTES = 64 * 1024
MAX_REQUEST_ID = 100


class ProtocolError(ValueError):
    """A frame the server will not act on; becomes an `error` event, the socket stays open."""

    def __init__(self, code: str, message: str, request_id: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class Prompt:
    request_id: str
    text: str
    conversation: int | None
    policy: str | None
    # The conversation's last answer that this prompt replaces (Regenerate, Edit and resend).
    replace: int | None = None
    # The answer, cut off at the token limit, whose rest this request writes (text is empty).
    continues: int | None = None


@dataclass(frozen=True)
class Cancel:
    """Stop a request: this connection's `request_id`, or any of the owner's answers by `message` id."""

    request_id: str | None
    message: int | None = None


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Resume:
    """Send again the owner's answer `message` from the event after number `after` (0: all of
    it), then its live events: a page that reloaded or reconnected picks up where it was."""

    message: int
    after: int = 0


def _request_id(frame: dict[str, Any]) -> str:
    value = frame.get("request_id")
    if not isinstance(value, str) or not value or len(value) > MAX_REQUEST_ID:
        raise ProtocolError(
            "bad_request_id",
            f"request_id must be a non-empty string of at most {MAX_REQUEST_ID} characters",
        )
    return value


# The error code for a frame whose string at this top-level field is not clean text.
_TEXT_CODES = {
    "text": "bad_prompt",
    "request_id": "bad_request_id",
    "policy": "bad_policy",
    "type": "unknown_type",
    "conversation": "bad_conversation",
    "message": "bad_message",
    "replace": "bad_message",
}


def _json_object(text: str | bytes) -> dict[str, Any]:
    """The frame's JSON object, through the input edge (chat/protocol/inputs.py): size, depth, text."""
    try:
        frame = inputs.json_parse(text, limit=MAX_FRAME_BYTES)
    except inputs.InputError as exc:
        raise _protocol_error(exc) from None
    if not isinstance(frame, dict):
        raise ProtocolError("bad_frame", "a frame must be a JSON object")
    return frame


def _protocol_error(exc: inputs.InputError) -> ProtocolError:
    if exc.code == inputs.TOO_LARGE:
        return ProtocolError("frame_too_large", f"the frame {exc.message}")
    if exc.code == inputs.BAD_JSON:
        return ProtocolError("bad_json", f"the frame {exc.message}")
    field = (exc.param or "").split(".")[0].split("[")[0]
    request_id = exc.value.get("request_id") if isinstance(exc.value, dict) else None
    if field == "request_id" or not isinstance(request_id, str) or inputs.text_problem(request_id):
        request_id = None  # the reply names the request only by an id that is clean text
    return ProtocolError(_TEXT_CODES.get(field, "bad_frame"), exc.message, request_id)


def parse_frame(text: str | None, *, max_prompt_chars: int) -> Prompt | Cancel | Ping | Resume:
    """Turn one text frame into a command, or raise ProtocolError saying what is wrong."""
    if text is None:
        raise ProtocolError(
            "binary_frame", "binary frames are not supported; send JSON text frames"
        )
    frame = _json_object(text)
    kind = frame.get("type")
    if kind == "ping":
        return Ping()
    if kind == "cancel":
        return _cancel(frame)
    if kind == "continue":
        return parse_continue(frame, request_id=_request_id(frame))
    if kind == "resume":
        return parse_resume(frame)
    if kind != "prompt":
        # ascii(): a lone surrogate would make the error itself unsendable; a long type is cut.
        shown = ascii(kind[:40]) if isinstance(kind, str) else f"of JSON type {type(kind).__name__}"
        raise ProtocolError(
            "unknown_type",
            f"unknown frame type {shown}; expected prompt, continue, cancel, resume or ping",
        )
    return parse_prompt(frame, request_id=_request_id(frame), max_prompt_chars=max_prompt_chars)


def _cancel(frame: dict[str, Any]) -> Cancel:
    if "message" not in frame:
        return Cancel(_request_id(frame))
    # With a message id the request_id is optional: another tab does not know it.
    request_id = _request_id(frame) if frame.get("request_id") is not None else None
    return Cancel(request_id, message=message_id(frame.get("message"), request_id))


def message_id(value: Any, request_id: str | None = None) -> int:
    """A message id from a client (the `message` of `accepted`), or ProtocolError."""
    if not isinstance(value, int) or inputs.id_parse(value) is None:
        raise ProtocolError(
            "bad_message",
            "message must be the id of an answer (the `message` of `accepted`)",
            request_id,
        )
    return value


def parse_resume(frame: dict[str, Any]) -> Resume:
    """A `resume` frame: {"type": "resume", "message": <answer id>, "after": <event number>}."""
    answer = message_id(frame.get("message"))
    after = frame.get("after", 0)
    if after is None:
        after = 0
    if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after < 2**31:
        raise ProtocolError("bad_frame", "after must be the number of an event (seq), or 0")
    return Resume(answer, after)


# SSE's `id:` of a running answer's event: "<message>:<seq>", sent back as Last-Event-ID.
def event_id(message: int, seq: int) -> str:
    return f"{message}:{seq}"


def parse_last_event_id(value: str) -> Resume:
    """A `Last-Event-ID` header (an `id:` this server sent) as the resume it asks for."""
    head, _, tail = value.strip().partition(":")
    message = inputs.id_parse(head)
    after = inputs.id_parse(tail) if tail != "0" else 0
    if message is None or after is None:
        raise ProtocolError("bad_message", "Last-Event-ID must be an id this server sent")
    return Resume(message, after)


def parse_prompt(frame: dict[str, Any], *, request_id: str, max_prompt_chars: int) -> Prompt:
    """The fields of a `prompt` frame (also the body of the HTTP API), checked."""
    prompt_text = frame.get("text")
    if not isinstance(prompt_text, str) or not prompt_text.strip():
        raise ProtocolError("bad_prompt", "text must be a non-empty string", request_id)
    if len(prompt_text) > max_prompt_chars:
        raise ProtocolError(
            "prompt_too_long",
            f"the prompt is {len(prompt_text)} characters; the limit is {max_prompt_chars}",
            request_id,
        )
    conversation = frame.get("conversation")
    if conversation is not None and (
        not isinstance(conversation, int) or inputs.id_parse(conversation) is None
    ):
        raise ProtocolError(
            "bad_conversation", "conversation must be a conversation id or null", request_id
        )
    policy = frame.get("policy")
    if policy is not None and (not isinstance(policy, str) or not policy or len(policy) > 50):
        raise ProtocolError("bad_policy", "policy must be a policy slug or omitted", request_id)
    replace = frame.get("replace")
    if replace is not None:
        replace = message_id(replace, request_id)
        if conversation is None:
            raise ProtocolError(
                "bad_conversation", "replace needs the conversation it belongs to", request_id
            )
    return Prompt(
        request_id=request_id,
        text=prompt_text,
        conversation=conversation,
        policy=policy,
        replace=replace,
    )


def parse_continue(frame: dict[str, Any], *, request_id: str) -> Prompt:
    """A `continue` frame: {"type": "continue", "request_id": ..., "message": <answer id>}."""
    answer = message_id(frame.get("message"), request_id)
    return Prompt(request_id=request_id, text="", conversation=None, policy=None, continues=answer)


def parse_http_prompt(body: bytes, *, max_prompt_chars: int) -> Prompt:
    """The JSON body of `POST /api/chat[/stream]`: a `prompt` (or `continue`) frame whose type
    and request_id may be left out."""
    frame = _json_object(body)
    kind = frame.get("type", "prompt")
    if kind not in ("prompt", "continue"):
        raise ProtocolError(
            "unknown_type", "the body must be a prompt or a continue (type may be omitted)"
        )
    request_id = (
        _request_id(frame) if frame.get("request_id") is not None else f"http-{uuid.uuid4().hex}"
    )
    if kind == "continue":
        return parse_continue(frame, request_id=request_id)
    return parse_prompt(frame, request_id=request_id, max_prompt_chars=max_prompt_chars)


def parse_http_cancel(body: bytes) -> int:
    """The JSON body of `POST /api/chat/cancel`: {"message": <id>}; returns the message id."""
    return message_id(_json_object(body).get("message"))


# -- server events ----------------------------------------------------------------------

# The `type` of every client frame and of every server event (one dataclass each in
# chat/protocol/events.py). The page reads these names from the server
# (chat/pages/page_constants.py) instead of copying them.
FRAME_TYPES = ("prompt", "continue", "cancel", "ping", "resume")
EVENT_TYPES = (
    "accepted",
    "queued",
    "reading",
    "chunk",
    "buffering",
    "retract",
    "cut",
    "done",
    "error",
    "cancel_ack",
    "pong",
)

# Why a turn ended (chat/protocol/events.py `Finish`); the names stay for their many readers.
MODERATED = Finish.MODERATED
INVALID = Finish.INVALID
CUT = Finish.CUT
INTERRUPTED = Finish.INTERRUPTED
FINISH_REASONS = tuple(reason.value for reason in Finish)
# The finish_reason of an answer a `continue` frame may go on with: cut off at the token limit.
CONTINUABLE = Finish.LENGTH.value
# Every finish_reason or stored status of an answer Continue takes: cut off at the token limit,
# interrupted by a server that stopped mid-answer, or failed mid-answer (the text kept goes on).
CONTINUABLE_REASONS = (Finish.LENGTH.value, Finish.INTERRUPTED.value, "failed")

METRIC_KEYS = (
    "queue_ms",
    "ttft_ms",
    "ttfv_ms",
    "total_ms",
    "held_ms",
    "new_tokens",
    "tokens_per_s",
    "prompt_tokens",
    "retries",
    "cached_new_tokens",
    "engine",
    "model",
    "fallback",
)


def metrics(
    *,
    queue_ms: float | None,
    ttft_ms: float | None,
    ttfv_ms: float | None,
    total_ms: float | None,
    held_ms: float | None,
    new_tokens: int,
    tokens_per_s: float,
    prompt_tokens: int | None,
    retries: int,
    cached_new_tokens: int | None = None,
    engine: str | None = None,
    model: str | None = None,
    fallback: bool = False,
) -> dict[str, Any]:
    """A `done` event's metrics, in milliseconds from when the server accepted the prompt.

    A cached answer generates nothing (new_tokens 0) and says in `cached_new_tokens` how many
    tokens it took when it was first generated; a live answer carries that key as null.
    """
    return {
        "queue_ms": queue_ms,
        "ttft_ms": ttft_ms,
        "ttfv_ms": ttfv_ms,
        "total_ms": total_ms,
        "held_ms": held_ms,
        "new_tokens": new_tokens,
        "tokens_per_s": tokens_per_s,
        "prompt_tokens": prompt_tokens,
        "retries": retries,
        "cached_new_tokens": cached_new_tokens,
        "engine": engine,
        "model": model,
        "fallback": fallback,
    }


def event_json(event: Event) -> str:
    """The one serializer of the socket's frames and SSE's `data:` lines."""
    return json.dumps(event_fields(event), ensure_ascii=False)


# A prompt sent while the server drains before a restart (SIGTERM); the page sends it again later.
SERVER_RESTARTING = "server_restarting"
# The `reason` of a `done` (cancelled) when nobody listened any more: its last client went away
# and none resumed it within CHAT_TIMEOUTS resume.
NO_LISTENER = "no_listener"
# The `reason` of a `done` (cancelled) whose conversation was deleted while it was generated.
CONVERSATION_DELETED = "conversation_deleted"
# The `reason` of a `done` (cancelled) whose API key was revoked while it was generated.
API_KEY_REVOKED = "api_key_revoked"
# The socket's close code when the server stops (4000-4999 are the application's own; 1012
# "service restart" is reserved for the WebSocket library). The page reconnects and says so.
CLOSE_SERVER_RESTARTING = 4012
# The socket's close code when the database is unavailable: "try again later".
CLOSE_TRY_LATER = 4503
# The socket's close code after the `error` `unauthorised`: its sign-in ended (signed out,
# deactivated, password changed). The page reloads, as whoever the browser now is.
CLOSE_UNAUTHORISED = 4401
# The `reason` of a `done` (cancelled) whose socket's sign-in ended while it was generated.
SIGNED_OUT = "signed_out"
# RFC 6455's "message too big": a message past daphne's own limit (project/websocket_limits.py).
CLOSE_MESSAGE_TOO_BIG = 1009


def error_fields(
    code: str, message: str, request_id: str | None = None, **added: Any
) -> dict[str, Any]:
    """An `error` event as a JSON body, for the HTTP views that answer one (`added`: its
    optional fields, `left` and `resets_at`)."""
    return event_fields(Error(request_id, code, message, **added))


def server_restarting_error(request_id: str | None = None) -> Error:
    """The `error` a prompt gets while the server drains."""
    return Error(
        request_id,
        SERVER_RESTARTING,
        "the server is restarting and takes no new prompts; send it again in a moment",
    )
