"""Weight-only quantized linears: every projection and the LM head read 4 or 8 bits a weight.

A decode step of a small model on a CPU reads every weight once per step, so its speed is set by
how many bytes the weights take. fp32 SmolLM2-135M is about 540 MB a token; int8 weights are a
quarter of that, int4 an eighth. Activations, norms, attention and the KV cache stay in the
model's dtype; only the matmuls read packed weights, through torch's own CPU kernels:

- int8: `aten._weight_int8pack_mm`, one symmetric int8 scale per output row.
- int4: `aten._weight_int4pack_mm_for_cpu`, asymmetric 4-bit in groups of 32 along the input,
  `w = (q - 8) * scale + zero`. That is exactly GGUF's Q4_1 block (`w = d * q + m`, 32 weights a
  block), so the bundled model's projections are loaded from the GGUF file's own blocks, bit for
  bit what llama.cpp reads, rather than re-quantized from a dequantized copy (gguf_blocks.py).

The LM head (tied to the embeddings in SmolLM2, Q8_0 in the GGUF) is int8 per row in both modes;
the embedding lookup keeps the model's own table. Which mode a start runs is quant_choice.py's.
"""

from __future__ import annotations

import torch
from torch import nn

from .weight_major import WeightMajorLinear

GROUP = 32  # int4 group size along the input: GGUF's Q4_1/Q8_0 block


def kernels_available() -> bool:
    """Whether this torch build has the CPU kernels (torch >= 2.5 or so)."""
    return hasattr(torch.ops.aten, "_weight_int8pack_mm") and hasattr(
        torch.ops.aten, "_weight_int4pack_mm_for_cpu"
    )


def int8_parts(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [out, in], scale [out]) with w ~ q * scale: symmetric, one scale per row."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return q, scales


def int4_parts(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [out, in] 0..15, scale, low [out, in / GROUP]) with w ~ q * scale + low per group."""
    w = weight.detach().float()
    out_features, in_features = w.shape
    groups = w.reshape(out_features, in_features // GROUP, GROUP)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=1e-12)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    return q.reshape(out_features, in_features), scale, low


def int4_weight(q: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """The float32 weight [out, in] that 4-bit parts stand for."""
    out_features, in_features = q.shape
    groups = q.reshape(out_features, -1, GROUP).float() * scale[..., None] + low[..., None]
    return groups.reshape(out_features, in_features)


class QuantLinear(nn.Module):
    """A bias-free linear whose weight is int8 per row or int4 in groups of GROUP (see module doc).

    `compute_dtype` is the activation dtype the kernel runs in; input and output keep the caller's.
    """

    def __init__(
        self,
        kind: str,
        in_features: int,
        out_features: int,
        weight: torch.Tensor,
        scales: torch.Tensor,
        compute_dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.kind = kind
        self.in_features = in_features
        self.out_features = out_features
        self.compute_dtype = compute_dtype
        self.register_buffer("qweight", weight)
        self.register_buffer("scales", scales.to(compute_dtype))

    @classmethod
    def int8(cls, weight: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> QuantLinear:
        """Symmetric int8, one scale per output row."""
        q, scales = int8_parts(weight)
        return cls("int8", q.shape[1], q.shape[0], q, scales, compute_dtype)

    @classmethod
    def int4(cls, weight: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> QuantLinear:
        """Asymmetric 4-bit per group of GROUP inputs (min/max), the way Q4_1 quantizes."""
        return cls.from_nibbles(*int4_parts(weight), compute_dtype)

    @classmethod
    def from_nibbles(
        cls,
        q: torch.Tensor,
        scale: torch.Tensor,
        low: torch.Tensor,
        compute_dtype: torch.dtype = torch.float32,
    ) -> QuantLinear:
        """From 4-bit values `q` [out, in] (0..15) with `w = q * scale + low` per group [out, groups]."""
        out_features, in_features = q.shape
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            q.to(torch.int32).contiguous(), 1
        )
        # The kernel's form: [groups, out, 2] of (scale, zero) with w = (q - 8) * scale + zero.
        scales = torch.stack([scale, low + 8 * scale], dim=-1).transpose(0, 1).contiguous()
        return cls("int4", in_features, out_features, packed, scales, compute_dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.reshape(-1, self.in_features)
        if rows.dtype != self.compute_dtype:
            rows = rows.to(self.compute_dtype)
        if self.kind == "int8":
            out = torch.ops.aten._weight_int8pack_mm(rows, self.qweight, self.scales)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                rows.contiguous(), self.qweight, GROUP, self.scales
            )
        if out.dtype != hidden.dtype:
            out = out.to(hidden.dtype)
        return out.reshape(*hidden.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.kind}, in_features={self.in_features}, out_features={self.out_features}"


def projections(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module, nn.Linear, str]]:
    """(parent, attribute, child, linear, qualified name) of every bias-free nn.Linear.

    A weight-major wrapper (weight_major.py) counts as the linear it wraps: it is the child that
    is swapped out and put back.
    """
    found = []
    for parent_name, parent in model.named_modules():
        if isinstance(parent, WeightMajorLinear):
            continue
        for name, child in parent.named_children():
            linear = child.linear if isinstance(child, WeightMajorLinear) else child
            if type(linear) is nn.Linear and linear.bias is None:
                qualified = f"{parent_name}.{name}" if parent_name else name
                found.append((parent, name, child, linear, qualified))
    return found


def quantize(
    model: nn.Module,
    mode: str,
    *,
    gguf_blocks: dict[str, QuantLinear] | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[list[tuple[nn.Module, str, nn.Module]], int]:
    """Swap every bias-free nn.Linear for a QuantLinear in `mode` ("int8" or "int4").

    In int4 mode a projection found in `gguf_blocks` (by qualified module name) takes those
    blocks; the LM head is int8 in both modes (a tied one keeps sharing its weight with the
    embedding, which still looks rows up in it). Returns (parent, name, original) per swapped
    layer, for `restore`, and how many layers came from GGUF blocks.
    """
    if mode not in ("int8", "int4"):
        raise ValueError(f"quantize mode {mode!r}: use int8 or int4")
    output = output_linear(model)
    undo, from_gguf = [], 0
    for parent, name, child, linear, qualified in projections(model):
        if mode == "int8" or linear is output or linear.in_features % GROUP:
            layer = QuantLinear.int8(linear.weight, compute_dtype)
        elif gguf_blocks and qualified in gguf_blocks:
            layer = gguf_blocks[qualified]
            from_gguf += 1
        else:
            layer = QuantLinear.int4(linear.weight, compute_dtype)
        setattr(parent, name, layer)
        undo.append((parent, name, child))
    return undo, from_gguf


def restore(undo: list[tuple[nn.Module, str, nn.Module]]) -> None:
    """Put back the layers `quantize` swapped out."""
    for parent, name, original in undo:
        setattr(parent, name, original)


def weights_mode(model: nn.Module) -> str:
    """How the loaded model's linears compute, read from the modules themselves (so a test that
    swaps layers is described as truly as a start-up choice): e.g. "BlockQuantLinear:q4_1" and
    "BlockQuantLinear:q8_0" joined by "+"; "Linear" alone for the float model."""
    kinds = set()
    for module in model.modules():
        if not hasattr(module, "in_features") or next(module.children(), None) is not None:
            continue
        kind = type(module).__name__
        detail = getattr(module, "kind", None)
        if detail:
            kind += f":{detail}"
        if getattr(module, "int8_activations", False):
            kind += ":int8-activations"
        kinds.add(kind)
    return "+".join(sorted(kinds))


def output_linear(model: nn.Module) -> nn.Module | None:
    """The LM head's nn.Linear, looking through a weight-major wrapper."""
    output = model.get_output_embeddings()
    return output.linear if isinstance(output, WeightMajorLinear) else output
