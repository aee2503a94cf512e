"""A backend that plays back scripted answers: the engine's Backend Protocol without a model.

For unit tests of what the turn (chat/turns/) does around generation (re-asks, retractions,
the cache, storage), which then run in milliseconds. The paths users take are tested on the real model.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from chat.engine.types import (
    Backend,
    EngineConfig,
    GenerationRequest,
    GenerationResult,
    OnText,
    PromptTooLong,
)


class ScriptFailure(RuntimeError):
    """Raised by a scripted answer that ends in a model failure."""


@dataclass
class Answer:
    """One scripted generation: these chunks, then this finish reason (or a failure).

    With `wait_for_cancel`, the answer stops after its chunks until the request is cancelled,
    as a long answer would still be generating.
    """

    chunks: tuple[str, ...]
    finish_reason: str = "eos"
    fail: bool = False
    wait_for_cancel: bool = False


class ScriptedBackend(Backend):
    """Plays `answers` in order, one per generation; records every request it was given."""

    model_id = "scripted"
    fingerprint = "scripted-weights"
    context_length = 2048
    eos_token_ids = [2]

    def __init__(self, answers: list[Answer]):
        self.config = EngineConfig(max_new_tokens_cap=1024)
        self.answers = list(answers)
        self.requests: list[GenerationRequest] = []
        self._lock = threading.Lock()

    def model_identity(self) -> dict[str, str]:
        return {"weights": self.fingerprint, "tokenizer": "ord"}

    def render(self, messages: list[dict]) -> str:
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"

    def encode(self, messages: list[dict]) -> list[int]:
        return [ord(c) for c in self.render(messages)]

    def token_count(self, text: str) -> int:
        return len(text)

    def token_id(self, token: str) -> int | None:
        return 2 if token == "<|im_end|>" else None

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        PromptTooLong.check(prompt_tokens, max_new_tokens, self.context_length)

    def request(self, messages: list[dict], **options) -> GenerationRequest:
        options.setdefault("max_new_tokens", min(256, self.config.max_new_tokens_cap))
        return GenerationRequest.of(self.encode(messages), **options)

    def generate(self, request: GenerationRequest, on_text: OnText) -> GenerationResult:
        with self._lock:
            self.requests.append(request)
            answer = self.answers.pop(0)
        started = time.perf_counter()
        first = None
        shown = []
        for chunk in answer.chunks:
            if request.cancel.is_set():
                break
            first = first or time.perf_counter()
            shown.append(chunk)
            on_text(chunk)
        if answer.fail:
            raise ScriptFailure("the scripted model failed")
        if answer.wait_for_cancel:
            request.cancel.wait(30)
        reason = "cancelled" if request.cancel.is_set() else answer.finish_reason
        return GenerationResult(
            text="".join(shown),
            finish_reason=reason,
            new_tokens=len(shown),
            prompt_tokens=len(request.input_ids),
            started_at=started,
            first_token_at=first,
            finished_at=time.perf_counter(),
        )

    def generate_batch(
        self, requests: list[GenerationRequest], on_texts: list[OnText]
    ) -> list[GenerationResult]:
        return [self.generate(r, t) for r, t in zip(requests, on_texts, strict=True)]
