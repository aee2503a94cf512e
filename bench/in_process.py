"""The benchmark's in-process generations, timed: the bare model.generate floor, the engine's own
generate, and a newcomer's first chunk while a long answer runs (`manage.py benchmark`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .benchmarking import CHAT_STOP_STRINGS


@dataclass
class Timed:
    """One in-process generation: seconds from the generate call."""

    tokens: int
    total_s: float
    first_s: float | None = None  # first visible text handed out
    model_first_s: float | None = None  # model's first new token
    finish: str = "length"

    @property
    def ms_per_token(self) -> float | None:
        return self.total_s * 1000 / self.tokens if self.tokens else None


def bare_generate(backend, input_ids: list[int], tokens: int) -> Timed:
    """The floor: model.generate for exactly `tokens` new tokens, greedy, no streamer, no criteria."""
    import torch

    ids = torch.tensor([input_ids], device=backend.device)
    pad = backend.tokenizer.pad_token_id
    pad = pad if pad is not None else backend.eos_token_ids[0]
    start = time.perf_counter()
    with torch.inference_mode():
        out = backend.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            pad_token_id=pad,
        )
    total = time.perf_counter() - start
    return Timed(tokens=out.shape[1] - len(input_ids), total_s=total)


def engine_forced_generate(
    backend, messages: list[dict], input_ids: list[int], tokens: int
) -> tuple[Timed | None, str]:
    """The engine streaming the same answer with its length forced to `tokens`; (timing, how it was forced).

    The public path: backend.generate with the `chat` policy's stop string and min_new_tokens.
    """
    request = backend.request(
        messages, max_new_tokens=tokens, min_new_tokens=tokens, stop_strings=CHAT_STOP_STRINGS
    )
    return _timed_engine(backend, request), "backend.generate, request.min_new_tokens"


def _timed_engine(backend, request) -> Timed:
    marks: list[float] = []

    def on_text(_text: str) -> None:
        if not marks:
            marks.append(time.perf_counter())

    start = time.perf_counter()
    result = backend.generate(request, on_text)
    total = time.perf_counter() - start
    return Timed(
        tokens=result.new_tokens,
        total_s=total,
        first_s=marks[0] - start if marks else None,
        model_first_s=result.first_token_at - start if result.first_token_at else None,
        finish=result.finish_reason,
    )


def engine_generate(backend, messages: list[dict], tokens: int) -> Timed:
    """The public engine path the server runs: backend.generate(request, on_text); eos may end it early."""
    return _timed_engine(
        backend, backend.request(messages, max_new_tokens=tokens, stop_strings=CHAT_STOP_STRINGS)
    )


@dataclass
class Newcomer:
    """A short prompt's first chunk (seconds from submit), alone and while a long answer decodes."""

    alone_s: float | None
    busy_s: float | None
    long_running: bool  # the long answer was still decoding when the newcomer's first chunk came
    long_tokens: int  # tokens the long answer had when it was cancelled
    long_finish: str | None


NEWCOMER = "Say hello in five words."
LONG_ANSWER = "Write a 600-word story about a lighthouse keeper."


def newcomer_first_chunk(backend, long_tokens: int, max_batch: int = 8) -> Newcomer:
    """The scheduler the server runs: a newcomer's first chunk, alone, then while a long answer runs.

    The long answer is forced to `long_tokens` (about 600 words at 800); it is cancelled once the
    newcomer has its first chunk, since the rest would measure nothing.
    """
    import threading

    from chat.engine.local.scheduler import ContinuousScheduler
    from chat.engine.types import Finished, TextChunk

    scheduler = ContinuousScheduler(backend, max_batch=max_batch)

    def submit(prompt, **options):
        first, done, box = threading.Event(), threading.Event(), {}

        def sink(event):
            if isinstance(event, TextChunk) and not first.is_set():
                box["first"] = time.perf_counter()
                first.set()
            if isinstance(event, Finished):
                box["result"] = event.result
                done.set()

        request = backend.request([{"role": "user", "content": prompt}], **options)
        box["sent"] = time.perf_counter()
        ticket, _ = scheduler.submit(request, sink)
        return ticket, first, done, box

    def first_chunk_s(box, first):
        return box["first"] - box["sent"] if first.wait(300) else None

    try:
        _, first, done, box = submit(NEWCOMER, max_new_tokens=24, stop_strings=CHAT_STOP_STRINGS)
        alone = first_chunk_s(box, first)
        done.wait(120)
        long_ticket, long_first, long_done, long_box = submit(
            LONG_ANSWER, max_new_tokens=long_tokens, min_new_tokens=long_tokens
        )
        long_first.wait(300)
        time.sleep(1.0)  # well into the long answer
        _, first, done, box = submit(NEWCOMER, max_new_tokens=24, stop_strings=CHAT_STOP_STRINGS)
        busy = first_chunk_s(box, first)
        long_running = not long_done.is_set()
        done.wait(120)
        scheduler.cancel(long_ticket)
        long_done.wait(120)
        result = long_box.get("result")
        return Newcomer(
            alone_s=alone,
            busy_s=busy,
            long_running=long_running,
            long_tokens=result.new_tokens if result else 0,
            long_finish=result.finish_reason if result else None,
        )
    finally:
        scheduler.close()
