"""GGUF block types widened at load into a faster kernel's layout, every weight the same float.

Each function takes a tensor's rows as the file stores them (uint8 [out, row bytes]) and returns
the parts of the split layout it becomes, (qs, d, m): Q5_0 and Q6_K the Q8_0 layout's int8 values
and scales (Q6_K's a scale per 16 weights) and no offsets, Q4_K the Q4_1 layout's packed nibbles,
scales and offsets. The
tests check every weight against `gguf.quants.dequantize` (tests/test_gguf_kernels.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# (qs, d, m): a split layout's values, scales and offsets (None but for Q4_1).
Parts = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]

from .block_types import GROUP, RAW_KINDS


def q5_0_as_q8_0(rows: torch.Tensor, in_features: int) -> Parts:
    """Q5_0 rows (`w = d * (q - 16)`, q of 5 bits) widened to Q8_0's split layout, exactly:
    q - 16 is an int8 and d the same scale, so every weight is the same float. The Q8_0
    kernel is 2.3x faster at one row than the 5-bit one (its second table and two-table
    permute) and 1.4x at 8, for 1.6x the bytes of these tensors; the 32-weight fallback of
    llama.cpp's K files (most of a Q4_K_M file of a model whose rows are not a multiple of
    256) is Q5_0."""
    out_features = rows.shape[0]
    blocks = _blocks(rows, in_features, "q5_0")
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    high_bits = blocks[..., 2:6].contiguous().view(torch.int32)  # weight j's fifth bit: bit j
    nibbles = blocks[..., 6:].to(torch.int16)  # weight j low, weight j + 16 high
    fifth = (high_bits >> torch.arange(GROUP, dtype=torch.int32)) & 1
    q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1) | (fifth.to(torch.int16) << 4)
    widened = (q - 16).to(torch.int8).reshape(out_features, in_features)
    return widened, d, None


def q4_k_as_q4_1(rows: torch.Tensor, in_features: int) -> Parts:
    """Q4_K rows widened to Q4_1's split layout, exactly: each 32-weight sub-block is
    `(d * sc) * q - dmin * m` with 6-bit sc and m, which is Q4_1's `d' * q + m'` with
    d' = d * sc and m' = -dmin * m, both exact in fp32. The Q4_1 kernel is 1.3-1.6x faster
    than the k-quant's (no scale unpacking per sub-block), for 1.3x the bytes; Q4_K is most
    of a Q4_K_M file of a model whose rows are a multiple of 256 (Llama 3, Qwen2.5-1.5B)."""
    out_features = rows.shape[0]
    blocks = _blocks(rows, in_features, "q4_k")
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [out, supers, 1]
    dmin = blocks[..., 2:4].contiguous().view(torch.float16).float()
    sc, mn = _k4_scales(blocks[..., 4:16].to(torch.int32))  # [out, supers, 8] each
    # 32 bytes per pair of sub-blocks: the even one's weights in the low nibbles, in order.
    pairs = blocks[..., 16:].reshape(out_features, -1, 4, 32)
    q = torch.stack([pairs & 0x0F, pairs >> 4], dim=3).reshape(out_features, -1, GROUP)
    packed = q[..., :16] | (q[..., 16:] << 4)  # Q4_1's order: weights j and j + 16
    return (
        packed.reshape(out_features, -1),
        (d * sc).reshape(out_features, -1),
        (-(dmin * mn)).reshape(out_features, -1),
    )


def q6_k_as_q8_0(rows: torch.Tensor, in_features: int) -> Parts:
    """Q6_K rows widened to Q8_0's split layout with a scale per 16 weights, exactly: each
    16 weights are `(d * sc) * (q - 32)` with an int8 sc and q of 6 bits, so q - 32 is an
    int8 and d * sc (an fp16 times an int8) is exact in fp32. No 32-weight layout holds them
    (two neighbouring 16s have their own scales), so the Q8_0 kernels take a scale per half
    block. 1.5x the bytes of these tensors; the kernel is 2-3x faster than the k-quant's
    (bench/scripts/block_kernel_timing.py). Q6_K is a Q6_K file's down projections and part
    of a Q4_K_M file's."""
    out_features = rows.shape[0]
    # A super-block: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, fp16 d.
    blocks = _blocks(rows, in_features, "q6_k")
    low = blocks[..., :128].reshape(out_features, -1, 2, 2, 32).to(torch.int16)
    high = blocks[..., 128:192].reshape(out_features, -1, 2, 1, 32).to(torch.int16)
    sc = blocks[..., 192:208].contiguous().view(torch.int8).float()  # [out, supers, 16]
    d = blocks[..., 208:210].contiguous().view(torch.float16).float()  # [out, supers, 1]
    # Each half of 128 weights: four runs of 32, from the low nibbles of ql[0:32] and
    # ql[32:64], then their high nibbles, with qh's bit pairs 0-1, 2-3, 4-5 and 6-7.
    nibbles = torch.cat([low & 0x0F, low >> 4], dim=3)  # [out, supers, 2, 4, 32]
    pairs = (high >> torch.tensor([0, 2, 4, 6], dtype=torch.int16).reshape(4, 1)) & 3
    q = (nibbles | (pairs << 4)) - 32
    widened = q.to(torch.int8).reshape(out_features, in_features)
    return widened, (d * sc).reshape(out_features, -1), None


# Each widened type's function, by kind; the layout each becomes is block_types.WIDENED_AS's.
WIDEN: dict[str, Callable[[torch.Tensor, int], Parts]] = {
    "q5_0": q5_0_as_q8_0,
    "q4_k": q4_k_as_q4_1,
    "q6_k": q6_k_as_q8_0,
}


def _blocks(rows: torch.Tensor, in_features: int, kind: str) -> torch.Tensor:
    """The rows' blocks, [out, blocks a row, block bytes], after checking they fit the width."""
    _, weights, block_bytes = RAW_KINDS[kind]
    if in_features % weights or rows.shape[1] != in_features // weights * block_bytes:
        raise ValueError(
            f"{kind}: in_features {in_features} is not a multiple of {weights}, or rows of "
            f"{rows.shape[1]} bytes do not fit it"
        )
    return rows.reshape(rows.shape[0], in_features // weights, block_bytes)


def _k4_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's get_scale_min_k4 for the 8 sub-blocks: (sc, m) float [..., 8] from the 12 scale
    bytes [..., 12] of a Q4_K (or Q5_K) super-block."""
    low, high = scales[..., 0:4], scales[..., 8:12]
    sc = torch.cat([low & 63, (high & 0x0F) | ((low >> 6) << 4)], dim=-1)
    mins = scales[..., 4:8]
    mn = torch.cat([mins & 63, (high >> 4) | ((mins >> 6) << 4)], dim=-1)
    return sc.float(), mn.float()
