"""Tiny random Llama and Qwen2 models written as GGUF files with gguf's own GGUFWriter, for tests.

Each file carries everything a model needs: architecture, sizes, rope settings, a byte-level
tokenizer with ChatML's markers and a chat template, and its tensors in the block types a test
names, per tensor (a mixed file, as llama.cpp's k-quant mixes are). Weights of the types gguf can
quantize come from random floats; the k-quants, which gguf only reads, are random bytes with
sane fp16 scales. Llama's q/k rows are stored in llama.cpp's rotary order, as the converter
writes them, so a reader that forgets to un-permute them computes another model.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from harness.gguf_rows import FLOAT_TYPES, blocks

Q = gguf.GGMLQuantizationType
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 256, 512, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Per tensor role: the mixes the tests write (every block type at least once).
LLAMA_MIX = {
    "attn_q": Q.Q4_K,
    "attn_k": Q.Q5_K,
    "attn_v": Q.Q6_K,
    "attn_output": Q.Q4_0,
    "ffn_gate": Q.Q5_0,
    "ffn_up": Q.Q5_1,
    "ffn_down": Q.Q4_1,
    "token_embd": Q.Q8_0,
    "output": Q.Q6_K,
}
QWEN2_MIX = {
    "attn_q": Q.Q8_0,
    "attn_k": Q.Q4_0,
    "attn_v": Q.Q5_1,
    "attn_output": Q.Q6_K,
    "ffn_gate": Q.Q4_K,
    "ffn_up": Q.Q5_K,
    "ffn_down": Q.Q5_0,
    "token_embd": Q.Q4_1,  # tied: no output tensor, the head reads these blocks
}


def byte_tokens() -> list[str]:
    """ChatML's markers, GPT-2's byte alphabet (a token a byte) and one merge's token."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return SPECIALS + [bytes_to_unicode()[byte] for byte in range(256)] + ["Ġt"]


def _add(
    writer: gguf.GGUFWriter,
    name: str,
    qtype: gguf.GGMLQuantizationType,
    rows: int,
    columns: int,
    rng,
) -> None:
    data = blocks(qtype, rows, columns, rng)
    if qtype in FLOAT_TYPES:
        writer.add_tensor(name, data)
    else:
        writer.add_tensor(name, data, raw_dtype=qtype)


def write_model(
    path: Path,
    architecture: str = "llama",
    mix: dict | None = None,
    seed: int = 0,
    theta: float = 10000.0,
) -> Path:
    """A tiny random `architecture` ("llama" or "qwen2") model at `path`, tensors typed by `mix`
    (role -> GGML type; a mix without "output" ties the head to the embedding)."""
    mix = mix or (LLAMA_MIX if architecture == "llama" else QWEN2_MIX)
    rng = np.random.default_rng(seed)
    tokens = byte_tokens()
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(f"tiny-{architecture}")
    writer.add_block_count(LAYERS)
    writer.add_context_length(4096)  # a policy's default answer fits
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(theta)
    writer.add_layer_norm_rms_eps(1e-5)
    if architecture == "llama":
        writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(["Ġ t"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    vocab = len(tokens)
    norm = lambda: (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)  # noqa: E731
    _add(writer, "token_embd.weight", mix["token_embd"], vocab, HIDDEN, rng)
    for layer in range(LAYERS):
        prefix = f"blk.{layer}."
        writer.add_tensor(prefix + "attn_norm.weight", norm())
        writer.add_tensor(prefix + "ffn_norm.weight", norm())
        shapes = {
            "attn_q": (HEADS * HEAD_DIM, HIDDEN),
            "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
            "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN),
            "attn_output": (HIDDEN, HEADS * HEAD_DIM),
            "ffn_gate": (INTERMEDIATE, HIDDEN),
            "ffn_up": (INTERMEDIATE, HIDDEN),
            "ffn_down": (HIDDEN, INTERMEDIATE),
        }
        for role, (rows, columns) in shapes.items():
            _add(writer, f"{prefix}{role}.weight", mix[role], rows, columns, rng)
            if architecture == "qwen2" and role in ("attn_q", "attn_k", "attn_v"):
                writer.add_tensor(
                    f"{prefix}{role}.bias", (0.1 * rng.standard_normal(rows)).astype(np.float32)
                )
    writer.add_tensor("output_norm.weight", norm())
    if "output" in mix:
        _add(writer, "output.weight", mix["output"], vocab, HIDDEN, rng)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
