"""A KV cache that grows in place: a decode step writes one column instead of copying them all.

transformers' `DynamicLayer.update` concatenates each step's key and value onto the cache, so
every step copies the whole cache of every layer (60 `aten::cat` a step for SmolLM2's 30
layers), a cost that grows with the answer and the rows (docs/engine.md has the figures). A
`GrowingLayer` keeps its keys and values in buffers with spare columns, writes new columns into
them, and reallocates only when they are full, with a quarter more room (at least HEADROOM
columns), so an append costs amortized O(1) and the spare room at most a quarter of the cache.

`keys` and `values` still read as the filled part, [batch, heads, length, dim], and assigning
them (the batch's joins, leaves and left trims do) replaces the buffer, so code written for
`DynamicLayer` works unchanged. A view handed out earlier never changes: columns are only ever
written past the filled length.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

# Spare columns a buffer is given beyond what it holds: 128 decode steps before a reallocation,
# 5.6 MB a row for SmolLM2-135M in fp32.
HEADROOM = 128


class GrowingLayer(DynamicLayer):
    """One layer's keys and values in buffers with spare columns (sequence axis -2)."""

    def __init__(self, **kwargs: Any) -> None:
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        # Apart, because callers assign keys and values one after the other (each read before
        # its own assignment must see the old length).
        self._key_length = self._value_length = 0
        super().__init__(**kwargs)  # sets keys/values to None through the setters below

    # -- the filled part, as DynamicLayer exposes it -----------------------------------------

    @property
    def keys(self) -> torch.Tensor | None:
        buffer = self._key_buffer
        return None if buffer is None else buffer[:, :, : self._key_length]

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        self._key_buffer = _with_headroom(tensor)
        self._key_length = 0 if tensor is None else tensor.shape[-2]

    @property
    def values(self) -> torch.Tensor | None:
        buffer = self._value_buffer
        return None if buffer is None else buffer[:, :, : self._value_length]

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._value_buffer = _with_headroom(tensor)
        self._value_length = 0 if tensor is None else tensor.shape[-2]

    # -- appending ------------------------------------------------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._key_buffer is None or self._value_buffer is None:
            self.keys, self.values = key_states, value_states
            return key_states, value_states
        start, added = self._key_length, key_states.shape[-2]
        if start + added > self._key_buffer.shape[-2]:
            self._grow(start + added)
        self._key_buffer[:, :, start : start + added] = key_states
        self._value_buffer[:, :, start : start + added] = value_states
        self._key_length = self._value_length = start + added
        return self._key_buffer[:, :, : start + added], self._value_buffer[:, :, : start + added]

    def buffers_with_room(self, added: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers (contiguous), grown if `added` more columns would not fit
        past the filled part: for a step that writes them itself (llama_step.py) and then calls
        `filled`."""
        assert self._key_buffer is not None and self._value_buffer is not None
        if self._key_length + added > self._key_buffer.shape[-2]:
            self._grow(self._key_length + added)
        return self._key_buffer, self._value_buffer

    def filled(self, added: int) -> None:
        """`added` columns past the filled part were written into the buffers."""
        self._key_length = self._value_length = self._key_length + added

    def _grow(self, needed: int) -> None:
        assert self._key_buffer is not None and self._value_buffer is not None
        capacity = needed + max(HEADROOM, needed // 4)
        self._key_buffer = _copied(self._key_buffer[:, :, : self._key_length], capacity)
        self._value_buffer = _copied(self._value_buffer[:, :, : self._value_length], capacity)

    def get_seq_length(self) -> int:
        return self._key_length if self.is_initialized else 0


class GrowingCache(DynamicCache):
    """A DynamicCache whose layers are GrowingLayers (created as the model first updates them)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)


def _with_headroom(tensor: torch.Tensor | None) -> torch.Tensor | None:
    if tensor is None or tensor.dim() != 4:  # DynamicLayer's empty placeholder is 1-d
        return tensor
    return _copied(tensor, tensor.shape[-2] + HEADROOM)


def _copied(tensor: torch.Tensor, capacity: int) -> torch.Tensor:
    batch, heads, length, dim = tensor.shape
    buffer = tensor.new_empty((batch, heads, capacity, dim))
    buffer[:, :, :length] = tensor
    return buffer
