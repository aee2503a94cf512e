"""A prefill chunk's forward pass that pauses between decoder layers and resumes where it paused.

A document is read a chunk (hundreds of tokens) per forward pass, a second or more on a small
CPU. Whoever arrives meanwhile would wait for the rest of that pass before joining; paused
between two layers instead, the pass lets them in after a thirtieth of it, and goes on later
from the layer it stopped at, so nothing computed is lost. A chunk's KV lives in its own
prefill's cache, which nothing else writes while it is paused.

The pass is transformers' own forward until it pauses: a pre-hook on each decoder layer asks
whether to stop and, if so, keeps that layer's inputs (the hidden states and the keyword
arguments the model computed once for every layer: mask, positions, rotary embeddings, cache).
Resuming calls the remaining layers with them, then the final norm and the LM head on the last
position, as the model's forward with `logits_to_keep=1` does.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class Paused:
    """A forward pass stopped before decoder layer `layer`, with that layer's inputs."""

    layer: int
    hidden: torch.Tensor
    kwargs: dict[str, Any]


class _Pause(Exception):
    def __init__(self, paused: Paused):
        super().__init__("paused between decoder layers")
        self.paused = paused


class PausableForward:
    """Runs a model's forward pass so that it may pause between decoder layers.

    Supported for a causal LM laid out as Llama's (`model.model.layers`, `model.model.norm`,
    `model.lm_head`) whose layers all attend in full, so every layer takes the same mask; for
    anything else `supported` is False and passes run whole.
    """

    def __init__(self, model: nn.Module):
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        norm, head = getattr(inner, "norm", None), getattr(model, "lm_head", None)
        self.supported = (
            isinstance(layers, nn.ModuleList)
            and len(layers) > 1
            and isinstance(norm, nn.Module)
            and isinstance(head, nn.Module)
            and all(
                getattr(layer, "attention_type", "full_attention") == "full_attention"
                for layer in layers
            )
        )
        self.layers: list[nn.Module] = list(layers) if self.supported else []  # type: ignore[arg-type]
        self.norm: nn.Module = norm if self.supported else nn.Identity()
        self.head: nn.Module = head if self.supported else nn.Identity()
        if self.supported:
            _hook_once(self.layers)

    def run(
        self, forward: Callable[[], torch.Tensor], pause: Callable[[], bool]
    ) -> torch.Tensor | Paused:
        """`forward()` (the model's pass, returning the last position's logits), asking `pause`
        before every layer but the first; returns the logits, or where it paused."""
        if not self.supported:
            return forward()
        _ACTIVE.pause = pause
        try:
            return forward()
        except _Pause as stop:
            return stop.paused
        finally:
            _ACTIVE.pause = None

    def resume(self, paused: Paused, pause: Callable[[], bool]) -> torch.Tensor | Paused:
        """Go on from where `paused` stopped: at least one layer runs before `pause` is asked
        again, so a pass that is paused and resumed over and over still ends."""
        hidden = paused.hidden
        for index in range(paused.layer, len(self.layers)):
            if index > paused.layer and pause():
                return Paused(index, hidden, paused.kwargs)
            out = self.layers[index](hidden, **paused.kwargs)
            hidden = out[0] if isinstance(out, tuple) else out
        logits = self.head(self.norm(hidden)[:, -1:, :])
        return logits[:, -1, :].float()


# The pause asked by this thread's pass, if it may pause: another thread's pass on the same
# model (a test's, a timing run's) never sees it.
_ACTIVE = threading.local()
# Decoder layers that carry the hook, installed once per model (a hook added and removed per
# pass would change the hooks while another thread's pass reads them).
_HOOKED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def _hook_once(layers: list[nn.Module]) -> None:
    for index, layer in enumerate(layers):
        if index and layer not in _HOOKED:
            layer.register_forward_pre_hook(
                functools.partial(_before_layer, index), with_kwargs=True
            )
            _HOOKED.add(layer)


def _before_layer(
    index: int, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    pause = getattr(_ACTIVE, "pause", None)
    if pause is not None and pause():
        kwargs = dict(kwargs)
        hidden = args[0] if args else kwargs.pop("hidden_states")
        raise _Pause(Paused(index, hidden, kwargs))
