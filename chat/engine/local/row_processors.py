"""A row's logits processors: what shapes its next token's scores before it is chosen."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from ..sampling_params import SamplingType
from .batching import Row
from .penalties import penalty_processors


class MinNewTokens(LogitsProcessor):
    """No eos before the row's min_new_tokens (transformers' own rebuilds a vocabulary-sized
    tensor on every call: 30 ms a step here)."""

    def __init__(self, row: Row):
        self.row = row
        self.eos = sorted(row.eos_ids)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if len(self.row.new_ids) < self.row.request.params.min_new_tokens:
            scores[:, self.eos] = -float("inf")
        return scores


def sampling_processors(row: Row, constrained: Any) -> LogitsProcessorList:
    """transformers' processors for one row: min_new_tokens, penalties, the schema's grammar,
    temperature/top_p (the grammar after the penalties, so it has the last word on what is legal)."""
    params = row.request.params
    processors = LogitsProcessorList()
    if params.min_new_tokens:
        processors.append(MinNewTokens(row))
    processors.extend(penalty_processors(params, prompt_length=len(row.request.input_ids)))
    if constrained is not None:
        processors.append(constrained)
    if params.sampling_type is not SamplingType.GREEDY:
        processors.append(TemperatureLogitsWarper(params.temperature))
        if params.top_p < 1.0:
            processors.append(TopPLogitsWarper(params.top_p))
    return processors
