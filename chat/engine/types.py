"""The engine's contract: the plain data that crosses its boundary, and the Protocols its parts implement.

A backend (local model or remote server) turns a GenerationRequest into text; a scheduler
queues requests in front of a backend and reports each one's life to its sink as events.
Nothing here imports torch or Django.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeVar, runtime_checkable

from .sampling_params import SamplingParams

# Why an engine generation ended. A chat turn adds its own reasons on top (chat/protocol/events.py, `Finish`).
FINISH_REASONS = ("eos", "stop_string", "length", "cancelled")

Progress = Callable[[str], None]  # one line of human-readable progress (loading, converting)
OnText = Callable[[str], None]  # visible text as it is decoded; chunks are not tokens or words


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


class EngineUnavailable(EngineError):
    """The engine cannot be reached (a remote server refused, went silent or hung up)."""

    code = "engine_unavailable"


@dataclass
class GenerationRequest:
    """One answer to generate.

    Args:
        input_ids: the rendered prompt, already tokenized.
        params: every decoding setting (sampling_params.py).
        cancel: set it from any thread to stop after at most one more decode step.
        label: a name for logs and benchmarks.
        messages: the chat as role/content dicts; a remote backend sends these instead of input_ids.
        tag: whose input this is, opaque (the chat's conversation); what the engine keeps of it
            (prefix KV, a shared generation's events) is filed under it, for `forget`. Never
            part of what the answer is: two tags may share one generation.
    """

    input_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    cancel: threading.Event = field(default_factory=threading.Event)
    label: str = ""
    messages: list[dict[str, Any]] | None = None
    tag: str = ""

    @classmethod
    def of(cls, input_ids: list[int], **options: Any) -> GenerationRequest:
        """A request from flat keyword options: SamplingParams' fields and this class's own."""
        own = {f.name for f in fields(cls)}
        params = {k: options.pop(k) for k in list(options) if k not in own}
        return cls(input_ids=input_ids, params=SamplingParams(**params), **options)


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
# Queued* -> Started -> Reading* -> TextChunk* -> Finished | Failed (a cancelled waiter gets
# Finished only; Reading comes only while a long prompt is read in chunks).


@dataclass(frozen=True)
class Queued:
    position: int  # requests ahead of this one; 0 means it runs next


@dataclass(frozen=True)
class Started:
    at: float


@dataclass(frozen=True)
class Reading:
    """How much of a long prompt the model has read (prefilled) so far, in tokens."""

    done: int
    total: int


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
    code: str = "model_error"  # the EngineError's wire code; engine_unavailable is told apart


Event = Queued | Started | Reading | TextChunk | Finished | Failed
Sink = Callable[[Event], None]  # called on the engine's thread; must not block


@dataclass(frozen=True)
class EngineConfig:
    """Everything the local engine needs, read from the environment by the caller.

    Args:
        model_path: a local Hugging Face model folder or a .gguf file; None for the bundled default.
        data_dir: where the converted default model is kept.
        dtype: "auto", "bfloat16", "float16" or "float32".
        device: "auto", "cpu", "cuda" or "mps".
        threads: torch intra-op threads, what a prefill runs on; 0 leaves torch's default.
        decode_threads: threads of a decode step; 0 is one fewer than `threads` (threads.py).
        max_new_tokens_cap: server-side ceiling on any request's max_new_tokens.
        weight_major: "auto", "on" or "off": decode-step matmuls as W @ x.T (weight_major.py).
        prefill_chunk: while rows decode, a newcomer's prompt is prefilled this many tokens per
            step; 0 prefills it whole.
        quant: "auto", "none", "int8" or "int4": weight-only quantized linears (quantized.py).
        prefix_cache_mb: KV of recent rows kept for reuse by prompts that start the same way
            (prefix_store.py); 0 turns reuse off.
        step: "fused" runs a decode step in one C++ call where the model allows it
            (llama_step.py); "eager" keeps transformers' forward for every pass.
    """

    model_path: str | None = None
    data_dir: str = "var"
    dtype: str = "auto"
    device: str = "auto"
    threads: int = 0
    decode_threads: int = 0
    max_new_tokens_cap: int = 1024
    weight_major: str = "auto"
    prefill_chunk: int = 128
    quant: str = "auto"
    prefix_cache_mb: int = 128
    step: str = "fused"


@dataclass(eq=False)
class Ticket:
    """A request's place in a scheduler; hand it back to `Scheduler.cancel`."""

    request: GenerationRequest
    sink: Sink
    submitted_at: float = field(default_factory=time.perf_counter)
    number: int = 0


def finish_cancelled(ticket: Ticket) -> None:
    """Tell a request that never ran (or never will) that it ended, cancelled, with no text."""
    now = time.perf_counter()
    ticket.sink(
        Finished(
            GenerationResult("", "cancelled", 0, len(ticket.request.input_ids), now, None, now)
        )
    )


class BackendConfig(Protocol):
    @property
    def max_new_tokens_cap(self) -> int:
        """The server-side ceiling on any request's max_new_tokens."""


@runtime_checkable
class Backend(Protocol):
    """Turns requests into text: the local model (local.backend.LocalBackend) or a remote server
    (remote.openai_backend.OpenAIBackend)."""

    config: BackendConfig
    model_id: str
    fingerprint: str  # identifies the weights; part of every cache key
    context_length: int
    eos_token_ids: list[int]

    def model_identity(self) -> dict[str, str]:
        """What decides this backend's answers besides the request: the weights (their files,
        quantization mode, dtype, device and kernels) and the tokenizer. Part of every answer's
        identity, so two processes that would answer differently never share an answer."""

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The exact model input for a conversation (the chat template applied)."""

    def encode(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of the rendered chat, where only the template's own markers become special
        tokens: text a user typed never does."""

    def token_count(self, text: str) -> int:
        """How many tokens `text` costs, for per-prompt limits."""

    def token_id(self, token: str) -> int | None:
        """Id of a single token such as "<|im_end|>", or None if the vocabulary lacks it."""

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise PromptTooLong when the prompt leaves no room for the answer."""

    def request(self, messages: list[dict[str, Any]], **options: Any) -> GenerationRequest:
        """A request for `messages` with `options` as GenerationRequest fields (max_new_tokens
        defaults to the smaller of 256 and the cap)."""

    def generate(self, request: GenerationRequest, on_text: OnText) -> GenerationResult:
        """Generate one answer in the calling thread, handing visible text to `on_text`."""

    def generate_batch(
        self, requests: list[GenerationRequest], on_texts: list[OnText]
    ) -> list[GenerationResult]:
        """Generate several answers together, each streamed and stopped on its own."""


# A backend's own type for a request's state in a running batch (local.batching.Row): the
# scheduler holds rows without looking inside, and hands them back to the backend.
RowT = TypeVar("RowT")


class Batch(Protocol[RowT]):
    """A running batch as its scheduler drives it (local.decoding.RunningBatch): rows join it
    between decode steps and leave it the step they end. Each call returns the rows that ended."""

    # Set by the scheduler: whether someone waits who could join now. A long prompt's chunk in
    # flight pauses for them and goes on at a later step.
    pause_when: Callable[[], bool] | None

    def __len__(self) -> int:
        """Rows in the batch, decoding or still prefilling."""

    def add(self, rows: list[RowT]) -> list[RowT]:
        """Join `rows` (their prompts prefilled now, or a chunk per step); those that ended at once."""

    def drop_cancelled(self) -> list[RowT]:
        """Take out the rows whose request was cancelled."""

    def step(self) -> list[RowT]:
        """One decode step for every row; the rows it ended."""


@runtime_checkable
class SteppedBackend(Backend, Protocol[RowT]):
    """A backend whose model runs in this process, so a scheduler can drive it one decode step at
    a time (local.backend.LocalBackend, driven by local.scheduler.ContinuousScheduler)."""

    def new_batch(self) -> Batch[RowT]:
        """An empty running batch: rows join it between decode steps and leave when they end."""

    def row(self, request: GenerationRequest, on_text: OnText) -> RowT:
        """A request's state in a running batch: its sampling, streaming and stopping."""

    def result(self, row: RowT, started: float, finished: float) -> GenerationResult:
        """What a finished row produced."""

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token of one row holds, for the scheduler's memory budget."""


@runtime_checkable
class Scheduler(Protocol):
    """Queues requests in front of a backend; every request's events go to its sink in the order
    Queued* -> Started -> Reading* -> TextChunk* -> Finished | Failed (a cancelled waiter gets Finished only)."""

    def expect(self) -> None:
        """Announce a request being prepared, so an idle worker may wait for it to join."""

    def unexpect(self) -> None:
        """Withdraw an `expect` whose request will not be submitted."""

    def submit(
        self, request: GenerationRequest, sink: Sink, *, expected: bool = False
    ) -> tuple[Ticket, int]:
        """Queue `request`; its ticket and how many requests are ahead of it. QueueFull when full."""

    def cancel(self, ticket: Ticket) -> None:
        """Stop the request wherever it is, within one more decode step; a no-op once finished."""

    @property
    def waiting(self) -> int: ...

    @property
    def running(self) -> int: ...

    def close(self) -> None:
        """Cancel everything and stop the worker."""
