"""Fewer operators per decoder layer: the MLP's gate and up projections as one block matmul, and
RMSNorm as torch's single operator.

A decode step of a 135M model runs a few hundred small operators; at a handful of rows each one
costs about as much to dispatch as to compute (docs/engine.md, "Where a decode step's time
goes"). The gate and up projections read the same input, so one kernel call over their
concatenated blocks computes both (the blocks are per output row, so every output is computed
exactly as before: the same values, bit for bit), and `FusedMLP` takes the place of
transformers' MLP module with two module calls fewer. Each RMSNorm becomes
`torch.nn.functional.rms_norm`: one operator for six, the same fp32 arithmetic.

Tried and not kept (figures in docs/engine.md): q/k/v as one matmul behind three slicing
stand-ins for transformers' attention module cost more Python than its kernel call saved.
"""

from __future__ import annotations

import torch
from torch import nn

from .blockquant import BlockQuantLinear


class FusedMLP(nn.Module):
    """A Llama-style MLP, down(act(gate(x)) * up(x)), with gate and up in one kernel call."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        gate, up = mlp.gate_proj, mlp.up_proj
        self.gate_up = BlockQuantLinear(
            gate.kind,
            gate.in_features,
            gate.out_features + up.out_features,
            torch.cat([gate.qs, up.qs]),
            torch.cat([gate.d, up.d]),
            torch.cat([gate.m, up.m]) if gate.kind == "q4_1" else None,
        )
        self.gate_up.int8_activations = gate.int8_activations
        self.down = mlp.down_proj
        self.act = mlp.act_fn
        self.width = gate.out_features
        # The module it stands for, with its gate and up as views of the fused blocks (no
        # second copy), so `split` can put it back.
        mlp.gate_proj, mlp.up_proj = (
            _rows(self.gate_up, 0, self.width),
            _rows(self.gate_up, self.width, up.out_features),
        )
        self.unfused = (mlp,)  # a tuple: not registered as a child twice

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up(hidden)
        return self.down(self.act(gate_up[..., : self.width]) * gate_up[..., self.width :])


class FusedRMSNorm(nn.Module):
    """transformers' RMSNorm as one operator (the same fp32 arithmetic)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight = norm.weight
        self.eps = float(norm.variance_epsilon)
        self.shape = (norm.weight.shape[0],)
        self.unfused = (norm,)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(hidden, self.shape, self.weight, self.eps)


def fuse(model: nn.Module) -> int:
    """Fuse the model's block MLPs and its RMSNorms in place; returns how many MLPs were fused.
    An MLP whose gate and up are not BlockQuantLinears of one kind (the float model's) is left
    alone; the norms are fused either way."""
    fused = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _fusable_mlp(child):
                setattr(parent, name, FusedMLP(child))
                fused += 1
            elif type(child).__name__.endswith("RMSNorm") and hasattr(child, "variance_epsilon"):
                setattr(parent, name, FusedRMSNorm(child))
    return fused


def split(model: nn.Module) -> None:
    """Put back the modules `fuse` stood in for (tests and timings compare the two)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, FusedMLP | FusedRMSNorm):
                setattr(parent, name, child.unfused[0])


def fused_mlps(model: nn.Module) -> int:
    return sum(isinstance(module, FusedMLP) for module in model.modules())


def _rows(linear: BlockQuantLinear, start: int, count: int) -> BlockQuantLinear:
    """A BlockQuantLinear over `count` output rows of `linear`'s blocks (views, no copy)."""
    rows = slice(start, start + count)
    part = BlockQuantLinear(
        linear.kind,
        linear.in_features,
        count,
        linear.qs[rows],
        linear.d[rows],
        linear.m[rows] if linear.kind == "q4_1" else None,
    )
    part.int8_activations = linear.int8_activations
    return part


def _fusable_mlp(module: nn.Module) -> bool:
    gate, up = getattr(module, "gate_proj", None), getattr(module, "up_proj", None)
    return (
        isinstance(gate, BlockQuantLinear)
        and isinstance(up, BlockQuantLinear)
        and isinstance(getattr(module, "down_proj", None), nn.Module)
        and callable(getattr(module, "act_fn", None))
        and gate.kind == up.kind
        and gate.in_features == up.in_features
        and gate.int8_activations == up.int8_activations
    )
