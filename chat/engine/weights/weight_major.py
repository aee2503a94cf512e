"""Matmuls for a few rows at once, computed weight-major where that is measured to be faster.

A decode step multiplies a handful of rows (one per running answer) by every weight matrix.
On the 2-core AMD EPYC measured here, MKL's GEMM for `x @ W.T` with 2 to 8 rows ran far slower
than one row (a 4-row step of SmolLM2 cost 2.6x a 1-row step), while `W @ x.T`, the same product
with the matrix on the left, streams each weight once like a matrix-vector product (the 4-row
step: 206 ms plain, 89 ms weight-major). Which order wins depends on the CPU, and timing one
matrix alone misleads (small matrices sit in cache there, not in a step), so `auto` times a
whole decode step both ways at load and keeps the faster. bench/scripts/weight_major_timing.py
prints the figures per batch size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

# The rows of a decode step; a prefill (rows x prompt tokens) or a large batch keeps the GEMM.
MIN_ROWS, MAX_ROWS = 2, 16
# Weight-major is kept only when the timed step is at least this much faster.
MARGIN = 0.9


class WeightMajorLinear(nn.Module):
    """A bias-free nn.Linear computed as `(W @ x.T).T` for MIN_ROWS..MAX_ROWS rows.

    It shares the wrapped layer's weight, so tied embeddings stay tied.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    @property
    def weight(self) -> nn.Parameter:
        return self.linear.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.reshape(-1, hidden.shape[-1])
        if not MIN_ROWS <= rows.shape[0] <= MAX_ROWS:
            return self.linear(hidden)
        out = torch.mm(self.linear.weight, rows.t()).t().contiguous()
        return out.reshape(*hidden.shape[:-1], out.shape[-1])


def wrap(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """Wrap every bias-free nn.Linear; returns (parent, name, original) to undo it."""
    undo = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.bias is None:
                setattr(parent, name, WeightMajorLinear(child))
                undo.append((parent, name, child))
    return undo


def unwrap(undo: list[tuple[nn.Module, str, nn.Linear]]) -> None:
    for parent, name, original in undo:
        setattr(parent, name, original)


def unwrap_all(model: nn.Module) -> bool:
    """Put back every wrapped layer; returns whether there was any."""
    undo = [
        (parent, name, child.linear)
        for parent in list(model.modules())
        for name, child in list(parent.named_children())
        if isinstance(child, WeightMajorLinear)
    ]
    unwrap(undo)
    return bool(undo)


def choose(model: nn.Module, time_step: Callable[[], float], mode: str = "auto") -> str:
    """Apply weight-major matmuls per `mode` ("on", or "auto": if a timed step says so).

    `time_step` returns the seconds of one representative multi-row decode step.
    Returns a line for the start-up log.
    """
    if mode == "on":
        return f"weight-major matmuls on ({len(wrap(model))} layers, CHAT_WEIGHT_MAJOR=on)"
    plain = time_step()
    undo = wrap(model)
    major = time_step()
    kept = major < plain * MARGIN
    if not kept:
        unwrap(undo)
    return (
        f"weight-major matmuls {'on' if kept else 'off'}: a 4-row decode step "
        f"{major * 1000:.0f} ms weight-major, {plain * 1000:.0f} ms plain"
    )
