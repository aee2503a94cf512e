"""The plain data that crosses the engine's boundary: requests, results, queue events."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

FINISH_REASONS = ("eos", "stop_string", "length", "cancelled")


class EngineError(RuntimeError):
    """A request the engine cannot serve; `code` is the wire protocol's error code."""

    code = "model_error"


class PromptTooLong(EngineError):
    code = "prompt_too_long"

    @classmethod
    def check(cls, prompt_tokens: int, max_new_tokens: int, context_length: int) -> None:
        """Refuse, rather than truncate, a prompt that leaves no room for the answer."""
        if prompt_tokens + max_new_tokens > context_length:
            raise cls(
                f"the prompt is {prompt_tokens} tokens; with room for {max_new_tokens} new tokens "
                f"that exceeds the model's context of {context_length} tokens"
            )


class QueueFull(EngineError):
    code = "queue_full"


@dataclass
class GenerationRequest:
    """One answer to generate.

    Args:
        input_ids: the rendered prompt, already tokenized.
        max_new_tokens: always set; the backend caps it at its configured ceiling.
        stop_strings: cut the answer where one appears; never shown to the user.
        eos_token_ids: extra end-of-sequence ids, on top of the model's own.
        temperature: 0 means greedy decoding.
        top_p: nucleus sampling when temperature > 0.
        json_schema: constrain decoding so the output is JSON valid for this schema.
        min_new_tokens: suppress eos until this many tokens (benchmarks use it for fixed lengths).
        cancel: set it from any thread to stop after at most one more decode step.
        messages: the chat as role/content dicts; a remote backend sends these instead of input_ids.
    """

    input_ids: list[int]
    max_new_tokens: int
    stop_strings: tuple[str, ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    json_schema: dict | None = None
    min_new_tokens: int = 0
    cancel: threading.Event = field(default_factory=threading.Event)
    label: str = ""
    messages: list[dict] | None = None


@dataclass
class GenerationResult:
    """What came out, why it ended, and how long each part took (perf_counter seconds)."""

    text: str
    finish_reason: str
    new_tokens: int
    prompt_tokens: int
    started_at: float
    first_token_at: float | None
    finished_at: float

    @property
    def decode_seconds(self) -> float:
        return max(self.finished_at - self.started_at, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_seconds if self.new_tokens else 0.0


# Events a scheduler sends to a request's sink, in this order:
# Queued* -> Started -> TextChunk* -> Finished | Failed (a cancelled waiter gets Finished only).


@dataclass(frozen=True)
class Queued:
    position: int  # requests ahead of this one; 0 means it runs next


@dataclass(frozen=True)
class Started:
    at: float


@dataclass(frozen=True)
class TextChunk:
    text: str


@dataclass(frozen=True)
class Finished:
    result: GenerationResult


@dataclass(frozen=True)
class Failed:
    error: str
    at: float
