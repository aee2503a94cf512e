"""Attention for decode steps: one query token a row, as two small matmuls.

transformers' "sdpa" attention calls torch's CPU flash-attention kernel, which for a single
query token costs 150-450 us a layer here (measured in a decode step, 1 and 4 rows, a few
hundred keys; bench/scripts/step_profile.py), about a sixth of a one-row step. With one query
a row there is nothing for its tiling to save: each KV head's group of query heads is one
[group, dim] x [dim, keys] matmul, a softmax and one [group, keys] x [keys, dim] matmul, with no
`repeat_kv` copy of the keys. Several query tokens (a prefill) go to transformers' own SDPA.

Registered with transformers' attention interface as "decode_sdpa" (and its mask function as
SDPA's, so the masks it is given are SDPA's: boolean, True where a key may be attended).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "decode_sdpa"


def decode_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query [batch, heads, q, dim], key/value [batch, kv_heads, keys, dim] -> [batch, q, heads, dim]."""
    batch, heads, q_length, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    if q_length != 1 or dropout or heads % kv_heads or kwargs.get("position_bias") is not None:
        out, _ = sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
        return out, None
    scale = dim**-0.5 if scaling is None else scaling
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).mul_(scale)  # [b, kv, group, keys]
    if attention_mask is not None:
        mask = attention_mask[..., -keys:]  # [b, 1, 1, keys]: one row, broadcast over heads
        if mask.dtype == torch.bool:
            scores = scores.masked_fill_(~mask, float("-inf"))
        else:
            scores = scores.add_(mask)
    weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights, value)  # [b, kv, group, dim]
    return out.reshape(batch, 1, heads, dim), None


def register() -> str:
    """Make "decode_sdpa" known to transformers (idempotent); returns its name."""
    AttentionInterface.register(NAME, decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME
