"""Attention for decode steps and short prefills: a few query tokens a row, as two matmuls.

transformers' "sdpa" attention calls torch's CPU flash-attention kernel, which for a single
query token costs 150-450 us a layer here (measured in a decode step, 1 and 4 rows, a few
hundred keys; bench/scripts/step_profile.py), about a sixth of a one-row step. With one query
a row there is nothing for its tiling to save: each KV head's group of query heads is one
[group, dim] x [dim, keys] matmul, a softmax and one [group, keys] x [keys, dim] matmul, with no
`repeat_kv` copy of the keys. A follow-up's few new tokens over a long reused history are the
same shape with group x q rows; there SDPA with a padding mask copied the history's keys and
values once per query head (`repeat_kv`) before its kernel ran: 16 ms of an 82 ms first token
at 1,700 keys. Longer prefills go to transformers' own SDPA.

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
# Up to this many query tokens a row (a decode step, a follow-up's few new tokens) the grouped
# matmuls run; a longer prefill goes to SDPA's flash kernel, which never materializes scores.
MAX_QUERY_TOKENS = 16


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
    if (
        q_length > MAX_QUERY_TOKENS
        or dropout
        or heads % kv_heads
        or kwargs.get("position_bias") is not None
    ):
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
    group = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    # Head h reads KV head h // group: each KV head's query heads and tokens are one matrix.
    grouped = query.reshape(batch, kv_heads, group * q_length, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).mul_(scale)
    scores = scores.view(batch, kv_heads, group, q_length, keys)
    mask = _mask(attention_mask, q_length, keys, query.device, is_causal)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill_(~mask, float("-inf"))
        else:
            scores = scores.add_(mask)
    weights = torch.softmax(scores, dim=-1).view(batch, kv_heads, group * q_length, keys)
    out = torch.matmul(weights, value).view(batch, heads, q_length, dim)
    return out.transpose(1, 2).contiguous(), None


def _mask(
    attention_mask: torch.Tensor | None,
    q_length: int,
    keys: int,
    device: torch.device,
    is_causal: bool | None,
) -> torch.Tensor | None:
    """SDPA's mask [b, 1, q, keys] as [b, 1, 1, q, keys] (shared by a KV head's query heads), or
    the causal mask transformers leaves to SDPA when nothing is padded."""
    if attention_mask is not None:
        return attention_mask[..., -keys:].unsqueeze(2)
    if q_length == 1 or is_causal is False:
        return None
    # The q new tokens are the last q keys: token i sees every key up to its own position.
    positions = torch.arange(keys - q_length, keys, device=device)[:, None]
    return torch.arange(keys, device=device)[None, :] <= positions


def register() -> str:
    """Make "decode_sdpa" known to transformers (idempotent); returns its name."""
    AttentionInterface.register(NAME, decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME
