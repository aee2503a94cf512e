"""Each row's next token from a step's logits, the rows that can be chosen together at once.

Most rows decode greedily, with at most a repetition penalty over their answer (the shipped prose
policy sets 1.1). Through transformers' processors each such row costs a tensor of its whole
prompt and answer, a signature inspection per processor and a padded copy of its vocabulary-wide
scores, one row after another: about a quarter of a millisecond a row, on the worker thread that
must hold the GIL for it. Here the rows sharing a penalty are penalised in one gather and one
scatter, the processor's own arithmetic (`torch.where(s < 0, s * p, s / p)` on the answer's
ids), and chosen with one argmax, so each gets the token its processors would give
(tests/test_choosing.py). Any other rule (sampling, a grammar, other penalties, a minimum
length) keeps the row's own processors.
"""

from __future__ import annotations

import torch
from transformers import RepetitionPenaltyLogitsProcessor

from ..sampling_params import SamplingType
from .batching import Row
from .penalties import AnswerOnly


def next_tokens(rows: list[Row], logits: torch.Tensor) -> list[int]:
    """The token each of `rows` takes from its row of `logits` [rows, vocab] (which it may
    change: the penalties are applied in place)."""
    penalised: dict[float, list[int]] = {}
    own: list[int] = []
    for index, row in enumerate(rows):
        if not row.processors:
            continue
        penalty = greedy_repetition_penalty(row)
        if penalty is None:
            own.append(index)
        elif row.new_ids:  # no answer yet: nothing to penalise, the plain argmax stands
            penalised.setdefault(penalty, []).append(index)
    for penalty, indices in penalised.items():
        _penalise(logits, indices, [rows[i].new_ids for i in indices], penalty)
    tokens: list[int] = logits.argmax(dim=-1).tolist()
    for index in own:
        tokens[index] = rows[index].pick(logits[index : index + 1])
    return tokens


def greedy_repetition_penalty(row: Row) -> float | None:
    """The penalty of a greedy row whose one processor is a repetition penalty on its answer;
    None for a row with any other rule."""
    if row.request.params.sampling_type is not SamplingType.GREEDY or len(row.processors) != 1:
        return None
    only = row.processors[0]
    if not isinstance(only, AnswerOnly) or only.prompt_length != len(row.request.input_ids):
        return None
    inner = only.processor
    if (
        type(inner) is not RepetitionPenaltyLogitsProcessor
        or inner.prompt_ignore_length is not None
    ):
        return None
    return float(inner.penalty)


def _penalise(
    logits: torch.Tensor, indices: list[int], answers: list[list[int]], penalty: float
) -> None:
    """RepetitionPenaltyLogitsProcessor's arithmetic on several rows at once, in place. A shorter
    answer is padded with its own first id: an id twice gets the same value twice."""
    width = max(len(ids) for ids in answers)
    ids = torch.tensor([a + a[:1] * (width - len(a)) for a in answers])
    where = (torch.tensor(indices).unsqueeze(1), ids)
    score = logits[where]
    logits[where] = torch.where(score < 0, score * penalty, score / penalty)
