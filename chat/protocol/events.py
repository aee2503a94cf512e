"""The server events of docs/protocol.md, one dataclass each, as a turn (or a transport) emits them.

A transport turns them into its own wire shape with one serializer: the socket and SSE with
`chat.protocol.event_json`, the OpenAI-compatible API with its chunks and completions. Fields are
in wire order; fields may be added, never renamed or removed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar, cast

from ..engine.types import FINISH_REASONS as ENGINE_FINISH_REASONS


class Finish(StrEnum):
    """Why a turn ended: the engine's reasons, plus the policy's verdicts on a finished generation."""

    EOS = "eos"
    STOP_STRING = "stop_string"
    LENGTH = "length"
    CANCELLED = "cancelled"
    MODERATED = "moderated"  # a moderation hook vetoed the answer; anything shown was retracted
    INVALID = "invalid"  # a structured answer failed its schema after every re-ask
    CUT = "cut"  # a hook cut the answer short at a loop or an invented turn; its good part stands
    # The server stopped (a crash, a kill) before the answer ended: what was saved as it grew is
    # kept, and Continue may finish it. Only a resume or the history ever says it.
    INTERRUPTED = "interrupted"


assert {f.value for f in Finish} >= set(ENGINE_FINISH_REASONS), "an engine reason is missing"


class Event:
    """A server event; `type` is its wire name."""

    type: ClassVar[str]


@dataclass(frozen=True)
class Accepted(Event):
    type: ClassVar[str] = "accepted"
    request_id: str
    conversation: int
    message: int
    queue_position: int
    seq: int | None = None  # its number in the answer's journal (chat/turns/journal.py)
    # A Continue's answer as it was before: what the chunks that follow are appended to.
    text_before: str | None = None


@dataclass(frozen=True)
class Queued(Event):
    type: ClassVar[str] = "queued"
    request_id: str
    queue_position: int
    seq: int | None = None  # its number in the answer's journal (chat/turns/journal.py)


@dataclass(frozen=True)
class Reading(Event):
    """The model is reading a long prompt (a pasted document): tokens read so far, of all."""

    type: ClassVar[str] = "reading"
    request_id: str
    tokens_read: int
    prompt_tokens: int
    seq: int | None = None  # its number in the answer's journal (chat/turns/journal.py)


@dataclass(frozen=True)
class Chunk(Event):
    """Chunks are not tokens or words: clients append them and never split on them."""

    type: ClassVar[str] = "chunk"
    request_id: str
    text: str
    seq: int | None = None  # its number in the answer's journal (chat/turns/journal.py)


@dataclass(frozen=True)
class Buffering(Event):
    type: ClassVar[str] = "buffering"
    request_id: str
    reason: str
    seq: int | None = None  # its number in the answer's journal (chat/turns/journal.py)


@dataclass(frozen=True)
class Retract(Event):
    type: ClassVar[str] = "retract"
    request_id: str
    reason: str
    seq: int | None = None  # its number in the answer's journal (chat/turns/journal.py)


@dataclass(frozen=True)
class Cut(Event):
    """What was shown is replaced by `text`, its good part; generation stops (finish_reason "cut")."""

    type: ClassVar[str] = "cut"
    request_id: str
    text: str
    reason: str
    seq: int | None = None  # its number in the answer's journal (chat/turns/journal.py)


@dataclass(frozen=True)
class Done(Event):
    """The end of a turn, live or cached: the same keys either way."""

    type: ClassVar[str] = "done"
    request_id: str
    message: int
    text: str
    json_value: object  # on the wire: `json`
    finish_reason: Finish
    cached: bool
    metrics: dict[str, Any]
    reason: str | None
    policy: str
    seq: int | None = None  # its number in the answer's journal (chat/turns/journal.py)
    # `invalid` and `moderated` only: why, in words for the user (chat/policy/explanation.py).
    explanation: dict[str, str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "finish_reason", Finish(self.finish_reason))


@dataclass(frozen=True)
class Error(Event):
    type: ClassVar[str] = "error"
    request_id: str | None
    code: str
    message: str
    seq: int | None = None  # its number in the answer's journal (chat/turns/journal.py)
    # `quota_exceeded` only: what is left of each budget that applies, and when the spent one
    # resets (ISO 8601, UTC).
    left: dict[str, int] | None = None
    resets_at: str | None = None


@dataclass(frozen=True)
class CancelAck(Event):
    """`result`: "cancelled" (stopped here), "sent" (another process was told), "finished"."""

    type: ClassVar[str] = "cancel_ack"
    request_id: str | None
    message: int
    result: str


@dataclass(frozen=True)
class Pong(Event):
    type: ClassVar[str] = "pong"


# Fields added to the contract that are left out where they have no value: `seq` outside a
# running answer's journal, `text_before` outside a Continue, `explanation` outside a failed answer.
_OMITTED_WHEN_NONE = frozenset({"seq", "text_before", "left", "resets_at", "explanation"})

# Field names that differ on the wire (a field cannot be called `json` beside the module).
_WIRE_NAMES = {"json_value": "json"}


def event_fields(event: Event) -> dict[str, Any]:
    """The event's fields by wire name, in wire order, `type` first."""
    body = {"type": event.type}
    for f in fields(cast(Any, event)):  # every Event subclass is a dataclass
        value = getattr(event, f.name)
        if f.name in _OMITTED_WHEN_NONE and value is None:
            continue  # added fields, sent only where they mean something
        body[_WIRE_NAMES.get(f.name, f.name)] = value.value if isinstance(value, StrEnum) else value
    return body


_BY_TYPE: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        Accepted,
        Queued,
        Reading,
        Chunk,
        Buffering,
        Retract,
        Cut,
        Done,
        Error,
        CancelAck,
        Pong,
    )
}


def event_from_fields(body: dict[str, Any]) -> Event:
    """The event `event_fields` gave `body` (an answer's events kept in Redis, read back)."""
    cls = _BY_TYPE[body["type"]]
    wire = {wire: name for name, wire in _WIRE_NAMES.items()}
    kwargs = {wire.get(key, key): value for key, value in body.items() if key != "type"}
    event: Event = cast(Any, cls)(**kwargs)
    return event
