"""A shared generation's events as entries of its Redis stream (coalescing_across.py), and back.

Times travel as durations: perf_counter is per process, so a follower rebuilds them on its own
clock as of when it reads the entry.
"""

from __future__ import annotations

import time
from typing import Any

from ..types import (
    Event,
    Failed,
    Finished,
    GenerationResult,
    Queued,
    Reading,
    Started,
    TextChunk,
)


def encode(event: Event, n: int) -> dict[str, Any]:
    """An event as JSON for the stream; times become durations (perf_counter is per process)."""
    if isinstance(event, Queued):
        return {"n": n, "t": "queued", "position": event.position}
    if isinstance(event, Started):
        return {"n": n, "t": "started"}
    if isinstance(event, Reading):
        return {"n": n, "t": "reading", "done": event.done, "total": event.total}
    if isinstance(event, TextChunk):
        return {"n": n, "t": "chunk", "text": event.text}
    if isinstance(event, Finished):
        result = event.result
        first = result.first_token_at
        return {
            "n": n,
            "t": "finished",
            "text": result.text,
            "finish_reason": result.finish_reason,
            "new_tokens": result.new_tokens,
            "prompt_tokens": result.prompt_tokens,
            "decode_s": result.finished_at - result.started_at,
            "first_token_s": None if first is None else first - result.started_at,
        }
    # The code travels too: a follower's turn tells an engine that went away from a model error.
    return {"n": n, "t": "failed", "error": event.error, "code": event.code}


def decode(data: dict[str, Any]) -> Event:
    """The event for this process, its times on this process's clock as of now."""
    now = time.perf_counter()
    kind = data["t"]
    if kind == "queued":
        return Queued(int(data["position"]))
    if kind == "started":
        return Started(at=now)
    if kind == "reading":
        return Reading(int(data["done"]), int(data["total"]))
    if kind == "chunk":
        return TextChunk(str(data["text"]))
    if kind == "finished":
        started = now - float(data["decode_s"])
        first = data["first_token_s"]
        return Finished(
            GenerationResult(
                str(data["text"]),
                str(data["finish_reason"]),
                int(data["new_tokens"]),
                int(data["prompt_tokens"]),
                started,
                None if first is None else started + float(first),
                now,
            )
        )
    return Failed(
        str(data.get("error") or "model_error"), at=now, code=str(data.get("code") or "model_error")
    )
