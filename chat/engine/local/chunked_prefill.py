"""Newcomers' prefill read over several steps: how far it is read, and the chunk in flight.

A long prompt is read a chunk per step (decoding.py says when), into a cache of its own that
joins the running batch once the whole prompt is read. A chunk may pause between two decoder
layers (pausable_forward.py) for someone waiting to join, and goes on at a later step.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .batching import Row
from .kv_cache import GrowingCache
from .pausable_forward import Paused


class ChunkedPrefill:
    """Newcomers prefilled together (left-padded), possibly over several steps.

    `mask` covers the `past` columns of reused KV already in `cache`, then `ids`.
    """

    def __init__(
        self,
        rows: list[Row],
        ids: torch.Tensor,
        mask: torch.Tensor,
        *,
        cache: DynamicCache | None = None,
        past: int = 0,
    ):
        self.rows, self.ids, self.mask = rows, ids, mask
        self.cache = cache if cache is not None else GrowingCache()
        self.past = past
        self.done = 0  # columns of `ids` already in the cache
        self.reading = 0  # the end of the chunk being read (past `done`)
        self.paused: Paused | None = None  # that chunk, stopped between two layers

    @property
    def left(self) -> int:
        return int(self.ids.shape[1]) - self.done

    def chunk(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ids of the chunk to read (the paused one, else the next `size` ids) and the mask
        up to its end."""
        if self.paused is None:
            self.reading = min(self.done + size, self.ids.shape[1])
        ids = self.ids[:, self.done : self.reading]
        return ids, self.mask[:, : self.past + self.reading]

    def read(self) -> None:
        """The chunk in flight is in the cache."""
        self.paused, self.done = None, self.reading

    def cancelled(self) -> bool:
        return any(row.request.cancel.is_set() for row in self.rows)

    def report(self) -> None:
        """Tell each row how much of its prompt is read (reused KV counts as read)."""
        read, total = self.past + self.done, self.past + self.ids.shape[1]
        for row in self.rows:
            if row.on_reading is not None:
                row.on_reading(read, total)

    def keep(self, rows: list[Row]) -> None:
        """Select `rows` (a subset, in order), e.g. when some were cancelled mid-prefill."""
        self._rewind()
        indices = row_indices(self.rows, rows, self.ids.device)
        if rows and (self.done or self.past):
            self.cache.batch_select_indices(indices)
        self.ids, self.mask, self.rows = self.ids[indices], self.mask[indices], rows

    def _rewind(self) -> None:
        """Forget a paused chunk (its saved inputs hold every row): the layers it reached drop
        its columns, and it is read again from its first layer."""
        if self.paused is None:
            return
        held = self.past + self.done
        if not held:
            self.cache = GrowingCache()
        for layer in self.cache.layers[: self.paused.layer] if held else ():
            layer.keys, layer.values = layer.keys[..., :held, :], layer.values[..., :held, :]
        self.paused = None


def row_indices(rows: list[Row], kept: list[Row], device: torch.device) -> torch.Tensor:
    """The positions in `rows` of `kept` (a subset, in order), for selecting cache rows."""
    position = {id(row): index for index, row in enumerate(rows)}
    return torch.tensor([position[id(row)] for row in kept], dtype=torch.long, device=device)
