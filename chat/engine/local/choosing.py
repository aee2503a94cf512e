"""Each row's next token from a step's logits, the rows that can be chosen together at once.

Most rows decode greedily, with at most a repetition penalty over their answer (the shipped
prose policy sets 1.1) and a minimum length. Through transformers' processors each such row
cost a tensor of its whole prompt and answer, a signature inspection per processor and a padded
copy of its vocabulary-wide scores, one row after another: about a quarter of a millisecond a
row, on the worker thread that must hold the GIL for it. Here the rows sharing a penalty are
penalised in one gather and one scatter, the processor's own arithmetic (`torch.where(s < 0,
s * p, s / p)` on the answer's ids), and chosen with one argmax, so each gets the token its
processors would give (tests/test_choosing.py). Any other rule (sampling, a grammar, other
penalties) keeps the row's own processors.
"""

from __future__ import annotations

import torch
from transformers import RepetitionPenaltyLogitsProcessor

from ..sampling_params import SamplingType
from .batching import Row
from .penalties import AnswerOnly
from .row_processors import MinNewTokens


def next_tokens(rows: list[Row], logits: torch.Tensor) -> list[int]:
    """The token each of `rows` takes from its row of `logits` [rows, vocab] (which it may
    change: the penalties are applied in place)."""
    penalised: dict[float, list[int]] = {}
    own: list[int] = []
    for index, row in enumerate(rows):
        if not row.processors:
            continue
        rules = greedy_rules(row)
        if rules is None:
            own.append(index)
            continue
        minimum, penalty = rules
        if minimum is not None:
            minimum(None, logits[index : index + 1])  # in place; it reads the row, not the ids
        if penalty is not None and row.new_ids:  # no answer yet: nothing to penalise
            penalised.setdefault(penalty, []).append(index)
    for penalty, indices in penalised.items():
        _penalise(logits, indices, [rows[i].new_ids for i in indices], penalty)
    tokens = _argmax_rows(logits)
    for index in own:
        tokens[index] = rows[index].pick(logits[index : index + 1])
    return tokens


def _argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's argmax (the first of equal maxima, as torch's). On the CPU through numpy:
    torch's argmax of 8 x 49,152 floats took 0.35 ms on 2 threads (up to 5 ms when its OpenMP
    team met the fused step's helpers), numpy's 0.03 ms."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        chosen: list[int] = logits.numpy().argmax(axis=-1).tolist()
    else:
        chosen = logits.argmax(dim=-1).tolist()
    return chosen


def greedy_rules(row: Row) -> tuple[MinNewTokens | None, float | None] | None:
    """(its minimum length's rule, its repetition penalty on the answer) for a greedy row whose
    processors are those alone, in that order, either absent; None for a row with any other."""
    if row.request.params.sampling_type is not SamplingType.GREEDY:
        return None
    processors = list(row.processors)
    minimum = processors.pop(0) if processors and type(processors[0]) is MinNewTokens else None
    if not processors:
        return minimum, None
    only = processors[0]
    if (
        len(processors) != 1
        or not isinstance(only, AnswerOnly)
        or only.prompt_length != len(row.request.input_ids)
        or type(only.processor) is not RepetitionPenaltyLogitsProcessor
        or only.processor.prompt_ignore_length is not None
    ):
        return None
    return minimum, float(only.processor.penalty)


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
