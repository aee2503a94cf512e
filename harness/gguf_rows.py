"""Weights laid out as a GGUF file stores them, for the kernel tests, the tiny GGUF models and the
kernels' timing script: float rows, rows `gguf` quantizes itself, and random valid k-quant blocks
(which `gguf` only reads)."""

from __future__ import annotations

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
# Byte offsets of the fp16 scales in the blocks gguf only reads (random bytes there could be inf).
K_SCALE_OFFSETS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82)}
FLOAT_TYPES = {Q.F32: np.float32, Q.F16: np.float16}


def blocks(
    qtype: gguf.GGMLQuantizationType, rows: int, columns: int, rng: np.random.Generator
) -> np.ndarray:
    """rows x columns weights of `qtype` as a GGUF file stores them (float, or uint8 rows)."""
    if qtype in FLOAT_TYPES:
        return (rng.standard_normal((rows, columns)) * 0.05).astype(FLOAT_TYPES[qtype])
    if qtype not in K_SCALE_OFFSETS:
        weights = (rng.standard_normal((rows, columns)) * 0.05).astype(np.float32)
        return gguf.quants.quantize(weights, qtype)
    block_weights, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (rows, columns // block_weights, block_bytes), dtype=np.uint8)
    for offset in K_SCALE_OFFSETS[qtype]:
        scales = (rng.random(data.shape[:2]) * 2e-4 + 2e-5).astype(np.float16)
        data[..., offset : offset + 2] = scales[..., None].view(np.uint8)
    return data.reshape(rows, -1)
