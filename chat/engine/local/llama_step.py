"""A decode step (or a short prefill) in one C++ call, for a Llama or Qwen2 model on GGUF blocks.

Through transformers' modules a decode step of SmolLM2 is about 1,500 dispatched torch operators
around the 211 block matmuls, each paying Python and the dispatcher: a third of a one-row step
and a quarter of an 8-row one (docs/engine.md, "Where a decode step's time goes"). llama.cpp
runs the same graph as plain loops; `kernels/llama_step.cpp` does too, for a step that feeds one
new token a row, on the tensors the eager path uses: the linears' blocks, the norms, the rotary
frequencies and the KV cache's buffers, into which it writes the new column as the eager step
would. A short prefill (several new tokens a row, each attending to the columns up to its own)
takes the same call; longer ones, a document's pausable chunks, and every model it does not
recognise keep transformers' forward.

`prepare(model)` says whether the model is one it computes exactly (a Llama or Qwen2 decoder, fp32
on the CPU, every projection and the LM head a BlockQuantLinear of any block type, biases on q, k
and v only, a static rotary table) and builds it;
the running batch calls the result for its decode steps (decoding.py). The logits match the
eager step's within fp32 rounding (tests/test_llama_step.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.cache_utils import Cache

from ..weights.blockquant import MAX_KERNEL_ROWS, BlockQuantLinear, kernels
from .kv_cache import GrowingCache, GrowingLayer

# New tokens a call computes at most, over all rows: past the block kernels' rows, transformers'
# forward dequantizes the blocks for torch's matrix multiply, which is faster there.
MAX_TOKENS = MAX_KERNEL_ROWS
# Rotary types whose frequencies do not change with the sequence's length (the dynamic ones
# recompute them as a sequence grows, which the C++ step does not).
STATIC_ROPE = ("default", "linear", "llama3")
# The decoders the C++ step computes: the same layer but for Qwen2's biases on q, k and v.
DECODERS = {
    "LlamaForCausalLM": "LlamaDecoderLayer",
    "Qwen2ForCausalLM": "Qwen2DecoderLayer",
}
PROJECTIONS = (
    ("self_attn", "q_proj"),
    ("self_attn", "k_proj"),
    ("self_attn", "v_proj"),
    ("self_attn", "o_proj"),
    ("mlp", "gate_proj"),
    ("mlp", "up_proj"),
    ("mlp", "down_proj"),
)


class LlamaStep:
    """Calls the C++ step on a running batch's new tokens, mask and GrowingCache."""

    def __init__(self, step: Any, layers: int, kv_heads: int = 0, head_dim: int = 0):
        self._step = step
        self.layers = layers
        self.kv_heads, self.head_dim = kv_heads, head_dim

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, cache: Cache) -> torch.Tensor | None:
        """Logits [rows, vocab] of each row's last token of `ids` [rows, new tokens], with the new
        columns written into `cache` (an empty one gets its first); None when the cache is not
        one it can write (the caller runs transformers' forward)."""
        rows, added = ids.shape
        if not cache.layers and isinstance(cache, GrowingCache) and self.kv_heads:
            empty = torch.empty((rows, self.kv_heads, 0, self.head_dim))
            for index in range(self.layers):
                cache.update(empty, empty, index)
        layers = cache.layers
        if len(layers) != self.layers or not all(
            type(layer) is GrowingLayer and layer.is_initialized for layer in layers
        ):
            return None
        buffers = [layer.buffers_with_room(added) for layer in layers]
        logits = self._step.forward(
            ids.reshape(-1).contiguous(),
            mask.contiguous(),
            [keys for keys, _ in buffers],
            [values for _, values in buffers],
        )
        for layer in layers:
            layer.filled(added)
        return logits


def prepare(model: nn.Module, helpers: int = 0) -> tuple[LlamaStep | None, str]:
    """The fused step for `model`, or None and why it keeps transformers' forward.

    `helpers`: threads that share each step's matmuls and attention with the calling thread
    (threads.py: one per core beyond the first)."""
    why = unsupported(model)
    if why:
        return None, why
    compiled = kernels()
    if compiled is None:
        return None, "the block-quant kernels are unavailable"
    config, inner = model.config, model.model
    rotary = inner.rotary_emb
    linears = [_parts(linear) for linear in _projections(inner)]
    attention = inner.layers[0].self_attn
    step = compiled.LlamaStep(
        embed=inner.embed_tokens.weight.detach().contiguous(),
        input_norms=[layer.input_layernorm.weight.detach() for layer in inner.layers],
        post_norms=[layer.post_attention_layernorm.weight.detach() for layer in inner.layers],
        final_norm=inner.norm.weight.detach(),
        linears=linears,
        head=_parts(model.lm_head),
        inv_freq=rotary.inv_freq.detach().float().contiguous(),
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=attention.head_dim,
        eps=float(inner.norm.variance_epsilon),
        rope_scaling=float(rotary.attention_scaling),
        attention_scale=float(attention.scaling),
        helpers=helpers,
    )
    return (
        LlamaStep(step, len(inner.layers), config.num_key_value_heads, attention.head_dim),
        describe(helpers),
    )


def describe(helpers: int) -> str:
    """The start-up log's line for a fused step with `helpers` helpers."""
    return "one C++ call a decode step, " + (
        f"on {helpers + 1} threads" if helpers else "on one thread"
    )


def _projections(inner: Any) -> list[Any]:
    """Every layer's seven projections, in the order the C++ step takes them."""
    return [
        getattr(getattr(layer, part), name) for layer in inner.layers for part, name in PROJECTIONS
    ]


def _parts(
    linear: BlockQuantLinear,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, bool, torch.Tensor]:
    bias = linear.bias if linear.bias is not None else torch.zeros(0)
    return (linear.qs, linear.d, linear.m, linear.ggml_type, linear.int8_activations, bias)


def unsupported(model: nn.Module) -> str:
    """Why the C++ step would not compute `model` exactly ("" when it would)."""
    config = getattr(model, "config", None)
    kind = type(model).__name__
    if kind not in DECODERS or config is None:
        return f"{kind} is not a Llama or Qwen2 decoder"
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"{model.dtype} on {model.device.type}: only fp32 on the CPU"
    if getattr(config, "hidden_act", "") != "silu" or getattr(config, "mlp_bias", False):
        return "the MLP is not a bias-free SiLU gate"
    inner = model.model
    if getattr(inner.rotary_emb, "rope_type", "") not in STATIC_ROPE:
        return f"rotary type {inner.rotary_emb.rope_type!r} changes with the length"
    if type(inner.embed_tokens) is not nn.Embedding:
        return "the embedding is not a plain table"
    linears = [model.lm_head, *_projections(inner)]
    if not all(type(m) is BlockQuantLinear for m in linears):
        return "the linears are not GGUF blocks (CHAT_ENGINE quant=gguf)"
    for layer in inner.layers:
        if type(layer).__name__ != DECODERS[kind] or getattr(
            layer.self_attn, "sliding_window", None
        ):
            return "a layer is not a full-attention decoder layer"
        biased = [
            layer.self_attn.o_proj,
            layer.mlp.gate_proj,
            layer.mlp.up_proj,
            layer.mlp.down_proj,
        ]
        if any(linear.bias is not None for linear in biased):
            return "a linear other than q, k or v has a bias"
    if model.lm_head.bias is not None:
        return "the LM head has a bias"
    return ""
