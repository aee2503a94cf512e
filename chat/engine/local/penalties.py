"""Penalties that keep a small model from looping, applied per row over the answer so far.

The prompt is left out on purpose: the chat template repeats the end-of-turn token in every
earlier turn, so penalising the prompt's tokens makes the model avoid ending its answer
(measured with `manage.py answerquality`; see docs/decoding.md).
"""

from __future__ import annotations

import torch
from transformers import (
    LogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from ..sampling_params import SamplingParams


class AnswerOnly(LogitsProcessor):
    """Runs `processor` on the generated ids alone, not on the prompt before them.

    Args:
        processor: any transformers logits processor that reads `input_ids`.
        prompt_length: how many leading ids are the prompt.
    """

    def __init__(self, processor: LogitsProcessor, prompt_length: int):
        self.processor = processor
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return self.processor(input_ids[:, self.prompt_length :], scores)


class FrequencyPresencePenalty(LogitsProcessor):
    """OpenAI's `frequency_penalty` and `presence_penalty`: each token's logit goes down by
    frequency * (times it was generated) + presence * (1 if it was generated at all).

    transformers has no such processor (its repetition penalty divides, and counts once).
    """

    def __init__(self, frequency: float, presence: float):
        self.frequency = frequency
        self.presence = presence

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] == 0:
            return scores
        for row, ids in enumerate(input_ids):
            counts = torch.bincount(ids, minlength=scores.shape[-1])[: scores.shape[-1]]
            penalty = self.frequency * counts + self.presence * (counts > 0)
            scores[row] -= penalty.to(scores.dtype)
        return scores


def penalty_processors(params: SamplingParams, *, prompt_length: int) -> list[LogitsProcessor]:
    """The processors for the penalties `params` sets (none for the neutral values)."""
    processors: list[LogitsProcessor] = []
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.frequency_penalty or params.presence_penalty:
        processors.append(
            FrequencyPresencePenalty(params.frequency_penalty, params.presence_penalty)
        )
    if params.no_repeat_ngram_size:
        processors.append(NoRepeatNGramLogitsProcessor(params.no_repeat_ngram_size))
    return [AnswerOnly(processor, prompt_length) for processor in processors]
