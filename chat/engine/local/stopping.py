"""What ends a generation early: its cancel flag, and its stop strings among the ids (the
text they would show is held back by holdback.py)."""

from __future__ import annotations

import threading

import torch
from transformers import PreTrainedTokenizerBase, StoppingCriteria, StopStringCriteria


class StopStrings:
    """transformers' StopStringCriteria, asked only after a token that could end a stop string.

    The criteria matches a stop string only when the last token's start overlaps the string's
    end (its own first test, read off the table it builds from the vocabulary); most tokens
    overlap no stop string's end, and for them the dozen tensor operations of a full check
    would say no. Built once per set of stop strings (scanning the vocabulary takes about a
    second); stateless afterwards.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop_strings: tuple[str, ...]):
        self.criteria = StopStringCriteria(tokenizer, list(stop_strings))
        self.maximum_token_len = self.criteria.maximum_token_len
        self.enders = _tokens_ending_a_stop_string(self.criteria)

    def hit(self, ids: list[int]) -> bool:
        """Whether `ids` (prompt and answer so far) end with one of the stop strings."""
        if not ids or ids[-1] not in self.enders:
            return False
        return bool(self.criteria(torch.tensor([ids[-self.maximum_token_len :]]), None))


def _tokens_ending_a_stop_string(criteria: StopStringCriteria) -> frozenset[int]:
    """The ids whose start overlaps the end of a stop string: StopStringCriteria's table holds,
    per token, its valid positions inside each stop string, then its overlaps with each one's
    end (-1 for none), then its length."""
    start = criteria.max_valid_positions * criteria.num_stop_strings
    overlaps = criteria.embedding_vec[:, start:-1]
    return frozenset(torch.nonzero((overlaps > 0).any(dim=1)).flatten().tolist())


class CancelledCriteria(StoppingCriteria):
    """Stop generation once `event` is set: a Stop button, a closed tab, a moderation hit.

    Checked by `generate` after every decode step, so at most one more token runs
    after the flag (about 9 us a step to check).

    Args:
        events: one cancel flag for the whole batch, or one per row.

    Example::

        cancel = threading.Event()
        model.generate(**enc, stopping_criteria=[CancelledCriteria(cancel)])
    """

    def __init__(self, events: threading.Event | list[threading.Event]):
        self.events = events

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: object
    ) -> torch.BoolTensor:
        if isinstance(self.events, threading.Event):
            return torch.full(
                (input_ids.shape[0],),
                self.events.is_set(),
                dtype=torch.bool,
                device=input_ids.device,
            )
        return torch.tensor(
            [event.is_set() for event in self.events], dtype=torch.bool, device=input_ids.device
        )
