"""One request's row in a running batch: its next-token rules, its text stream and why it ended.

Decoding is bound by memory bandwidth, so a batch of 8 costs little more per step than
one request. Every rule that ends an answer is applied per row: its cancel flag (checked
by the batch before each step), its eos ids, its stop strings and its max_new_tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tokenizers.decoders import DecodeStream
from transformers import LogitsProcessorList

from ..sampling_params import SamplingType
from ..text.holdback import StopStringHoldback
from ..types import GenerationRequest, OnText
from .stopping import StopStrings


@dataclass(eq=False)
class Row:
    """One request's state inside a running batch.

    Args:
        request: what to generate.
        on_text: receives the visible text, piece by piece (never a stop string or part of one).
        max_new: new tokens allowed (the request's, capped by the server).
        eos_ids: the model's end-of-sequence ids and the request's extra ones.
        processors: transformers logits processors for this row alone; empty means greedy argmax.
    """

    request: GenerationRequest
    on_text: OnText
    max_new: int
    eos_ids: frozenset[int]
    processors: LogitsProcessorList = field(default_factory=LogitsProcessorList)
    holdback: StopStringHoldback | None = None
    shown: list[str] = field(default_factory=list)
    new_ids: list[int] = field(default_factory=list)
    first_token_at: float | None = None
    reason: str | None = None  # why it ended: a FINISH_REASONS value once set
    stop: StopStrings | None = None
    decoder: DecodeStream | None = None
    tokenizer: Any = None
    # A seeded request samples from its own generator, so its answer does not depend on what
    # else the process sampled before or beside it.
    generator: torch.Generator | None = None
    # Told (tokens read, prompt tokens) after each chunk of a long prompt read in chunks.
    on_reading: Callable[[int, int], None] | None = None

    def prepare(self, stop_criteria: Callable[[tuple[str, ...]], StopStrings]) -> None:
        """Build what the row needs once it runs: stop-string matcher, holdback, text decoder."""
        stops = tuple(self.request.params.stop_strings)
        self.holdback = StopStringHoldback(stops)
        self.stop = stop_criteria(stops) if stops else None
        # Each token's text as soon as its bytes make whole characters (transformers'
        # TextStreamer held a word back until the next began: the first text came a step late).
        self.decoder = DecodeStream(skip_special_tokens=True)
        params = self.request.params
        if params.sampling_type is SamplingType.RANDOM_SEED:
            self.generator = torch.Generator().manual_seed(params.generator_seed)

    def ids(self, last: int | None = None) -> torch.Tensor:
        """The row's prompt and answer so far as a [1, n] tensor (only the `last` ones if given)."""
        ids = self.request.input_ids + self.new_ids
        return torch.tensor([ids[-last:] if last else ids])

    def pick(self, scores: torch.Tensor) -> int:
        """The next token from this row's [1, vocab] scores, under its processors."""
        scores = self.processors(self.ids(), scores)
        if self.request.params.sampling_type is not SamplingType.GREEDY:
            probabilities = torch.softmax(scores, dim=-1)
            if self.generator is not None:  # a CPU generator samples CPU tensors
                probabilities = probabilities.float().cpu()
            return int(torch.multinomial(probabilities, 1, generator=self.generator))
        return int(scores.argmax(dim=-1))

    def accept(self, token: int, now: float) -> None:
        """Take the chosen token: stream its text, then end the row if a rule says so."""
        self.new_ids.append(token)
        self.first_token_at = self.first_token_at or now
        piece = self.decoder.step(self.tokenizer.backend_tokenizer, token)
        if piece:
            self.emit(piece)
        if token in self.eos_ids:
            self.end("eos")
        elif self.holdback.stopped or (self.stop is not None and self.stop.hit(self._last_ids())):
            self.end("stop_string")
        elif len(self.new_ids) >= self.max_new:
            self.end("length")

    def _last_ids(self) -> list[int]:
        # A stop string's check reads at most its longest string's length in ids.
        assert self.stop is not None
        wanted = self.stop.maximum_token_len
        if len(self.new_ids) >= wanted:
            return self.new_ids[-wanted:]
        return (self.request.input_ids + self.new_ids)[-wanted:]

    def end(self, reason: str) -> None:
        """Mark the row done and release the text the holdback still holds (the decoder holds
        only the bytes of a character the answer never finished)."""
        if self.holdback.stopped and reason != "eos":
            reason = "stop_string"
        self.reason = reason
        tail = self.holdback.finish()
        if tail:
            self.shown.append(tail)
            self.on_text(tail)

    def emit(self, text: str) -> None:
        visible = self.holdback.feed(text)
        if visible:
            self.shown.append(visible)
            self.on_text(visible)

    @property
    def text(self) -> str:
        return "".join(self.shown)


def left_pad(
    sequences: list[list[int]], pad_id: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoder-only models continue from the right end, so padding goes on the left."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for index, sequence in enumerate(sequences):
        ids[index, width - len(sequence) :] = torch.tensor(sequence)
        mask[index, width - len(sequence) :] = 1
    return ids.to(device), mask.to(device)
