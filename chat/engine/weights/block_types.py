"""The GGML block types the kernels compute: their type ids, block sizes and layouts.

Q4_1 and Q8_0 are split into the kernels' own layout (blockquant.py); the file types in
`RAW_KINDS` are read as stored, except those `WIDENED_AS` names (widening.py).
"""

from __future__ import annotations

GROUP = 32
Q8_0_BLOCK_BYTES = 34  # fp16 d, then 32 int8
Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles
GGML_Q8_0 = 8
GGML_Q4_1 = 3
# The formats kernels/rawblocks.cpp reads as the file stores them: GGML type id, weights and
# bytes a block. Q4_1 and Q8_0 are split into their own layout for blockquant.cpp's kernels.
RAW_KINDS = {
    "q4_0": (2, 32, 18),
    "q5_0": (6, 32, 22),
    "q5_1": (7, 32, 24),
    "q4_k": (12, 256, 144),
    "q5_k": (13, 256, 176),
    "q6_k": (14, 256, 210),
}
SPLIT_KINDS = {"q4_1": (GGML_Q4_1, 32, Q4_1_BLOCK_BYTES), "q8_0": (GGML_Q8_0, 32, Q8_0_BLOCK_BYTES)}
# The file types `from_gguf` computes in a faster kernel's layout, every weight the same float.
WIDENED_AS = {"q5_0": "q8_0", "q4_k": "q4_1", "q6_k": "q8_0"}
# Every GGUF tensor type a BlockQuantLinear computes, by GGML type id.
KIND_OF_TYPE = {ggml: kind for kind, (ggml, _, _) in {**RAW_KINDS, **SPLIT_KINDS}.items()}
