"""Several requests in one `model.generate` call: left-padded, streamed and stopped per row.

Decoding is bound by memory bandwidth, so a batch of 4 costs little more per step
than one request (DESIGN.md: 17.6 tok/s at batch 1, 62 at batch 4). Every rule that
ends an answer is applied per row: its cancel flag, its eos ids, its stop strings
and its max_new_tokens; a finished row's later (padding) tokens are ignored.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import StoppingCriteria, StopStringCriteria
from transformers.generation.streamers import BaseStreamer

from .stopping import CancelledCriteria, StopStringHoldback
from .types import GenerationRequest, OnText


@dataclass
class Row:
    """One request's state inside a batch."""

    request: GenerationRequest
    on_text: OnText
    max_new: int
    eos_ids: frozenset[int]
    holdback: StopStringHoldback
    shown: list[str] = field(default_factory=list)
    new_ids: list[int] = field(default_factory=list)
    first_token_at: float | None = None
    stop_len: int | None = None  # new tokens when a stopping rule fired; later ones are padding
    hit_stop_string: bool = False

    def emit(self, text: str) -> None:
        visible = self.holdback.feed(text)
        if visible:
            self.shown.append(visible)
            self.on_text(visible)

    def flush(self) -> None:
        tail = self.holdback.finish()
        if tail:
            self.shown.append(tail)
            self.on_text(tail)


class BatchStreamer(BaseStreamer):
    """Receives each step's tokens for the whole batch and feeds the rows they belong to.

    generate checks stopping criteria before it hands a step's tokens to the streamer,
    so a row's last token arrives after the row was marked done: `stop_len` says which
    tokens are still the row's own.
    """

    def __init__(self, tokenizer, rows: list[Row]):
        from transformers import TextStreamer

        self.rows = rows
        self.decoders = []
        for row in rows:
            decoder = TextStreamer(tokenizer, skip_prompt=False, skip_special_tokens=True)
            decoder.on_finalized_text = (
                lambda r: lambda text, stream_end=False: text and r.emit(text)
            )(row)
            self.decoders.append(decoder)
        self._prompt_seen = False
        self._step = 0

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate hands over the prompt first
            self._prompt_seen = True
            return
        self._step += 1
        now = time.perf_counter()
        for index, token in enumerate(value.reshape(-1).tolist()):
            row = self.rows[index]
            if row.stop_len is not None and self._step > row.stop_len:
                continue  # padding after this row ended
            row.new_ids.append(token)
            row.first_token_at = row.first_token_at or now
            self.decoders[index].put(torch.tensor([token]))

    def end(self) -> None:
        for decoder in self.decoders:
            decoder.end()


class BatchStoppingCriteria(StoppingCriteria):
    """Per row: cancel flag, eos ids, stop strings (transformers' StopStringCriteria) and max_new_tokens.

    generate stops when every row is done. `stop_criteria` returns a StopStringCriteria
    for a set of stop strings; building one scans the whole vocabulary (0.8 s here),
    so the backend hands out cached ones.
    """

    def __init__(
        self,
        stop_criteria: Callable[[tuple[str, ...]], StopStringCriteria],
        rows: list[Row],
        prompt_width: int,
    ):
        self.rows = rows
        self.prompt_width = prompt_width
        groups: dict[tuple[str, ...], list[int]] = {}
        for index, row in enumerate(rows):
            if row.request.stop_strings:
                groups.setdefault(tuple(row.request.stop_strings), []).append(index)
        self.stop_groups = [(stop_criteria(stops), indices) for stops, indices in groups.items()]
        self.cancelled = CancelledCriteria([row.request.cancel for row in rows])

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs
    ) -> torch.BoolTensor:
        new = input_ids.shape[1] - self.prompt_width
        last = input_ids[:, -1].tolist()
        stop_hits = [False] * len(self.rows)
        for criteria, indices in self.stop_groups:
            fired = criteria(input_ids, scores)
            for index in indices:
                stop_hits[index] = bool(fired[index])
        cancelled = self.cancelled(input_ids, scores).tolist()
        for index, row in enumerate(self.rows):
            if row.stop_len is not None:
                continue
            row.hit_stop_string = stop_hits[index]
            if (
                cancelled[index]
                or stop_hits[index]
                or last[index] in row.eos_ids
                or new >= row.max_new
            ):
                row.stop_len = new
        return torch.tensor(
            [row.stop_len is not None for row in self.rows],
            dtype=torch.bool,
            device=input_ids.device,
        )


def finish_reason(row: Row) -> str:
    # A natural end wins over a cancel that arrived in the same step.
    if row.new_ids and row.new_ids[-1] in row.eos_ids:
        return "eos"
    if row.hit_stop_string or row.holdback.stopped:
        return "stop_string"
    if row.request.cancel.is_set():
        return "cancelled"
    if len(row.new_ids) >= row.max_new:
        return "length"
    return "eos"


def left_pad(sequences: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoder-only models continue from the right end, so padding goes on the left."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for index, sequence in enumerate(sequences):
        ids[index, width - len(sequence) :] = torch.tensor(sequence)
        mask[index, width - len(sequence) :] = 1
    return ids.to(device), mask.to(device)
