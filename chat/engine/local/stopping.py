"""A generation ends early when its cancel flag is set (stop strings: holdback.py)."""

from __future__ import annotations

import threading

import torch
from transformers import StoppingCriteria


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
