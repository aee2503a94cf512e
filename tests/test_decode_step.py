"""The decode step's own pieces: the KV cache that appends in place and the one-query attention,
each against what transformers computes, then in the real model's running batch."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from chat.engine.local import attention
from chat.engine.local.kv_cache import HEADROOM, GrowingCache, GrowingLayer


def _kv(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, 3, length, 8)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


@pytest.mark.unit
def test_growing_layer_holds_what_a_dynamic_layer_holds_through_appends_and_reshapes():
    """Appends (a prefill, then single columns past several reallocations), a batch selection
    and a left trim: the filled part equals transformers' concatenating layer at every point."""
    growing, dynamic = GrowingLayer(), DynamicLayer()
    chunks = [_kv(3, 20, 0), *(_kv(3, 1, seed) for seed in range(1, 2 * HEADROOM + 40))]
    for index, (keys, values) in enumerate(chunks):
        got = growing.update(keys, values)
        want = dynamic.update(keys, values)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), index
        assert growing.get_seq_length() == dynamic.get_seq_length()
    assert growing._key_buffer.shape[-2] > growing.get_seq_length()  # spare room, not a copy a step

    for layer in (growing, dynamic):
        layer.batch_select_indices(torch.tensor([2, 0]))
        layer.keys = layer.keys[..., 5:, :]  # the batch trims padding nobody needs on the left
        layer.values = layer.values[..., 5:, :]
        layer.update(*_kv(2, 1, 999))
    assert torch.equal(growing.keys, dynamic.keys)
    assert torch.equal(growing.values, dynamic.values)
    assert growing.get_seq_length() == dynamic.get_seq_length() == 20 + 2 * HEADROOM + 39 - 5 + 1


@pytest.mark.unit
def test_a_view_handed_out_never_changes_when_the_layer_appends():
    layer = GrowingLayer()
    layer.update(*_kv(1, 10, 0))
    before = layer.keys
    copy = before.clone()
    for seed in range(1, 5):
        layer.update(*_kv(1, 1, seed))
    assert torch.equal(before, copy)
    assert before.shape[-2] == 10 and layer.keys.shape[-2] == 14


@pytest.mark.unit
def test_growing_cache_makes_growing_layers():
    cache = GrowingCache()
    keys, values = _kv(2, 4, 0)
    cache.update(keys, values, 0)
    cache.update(keys, values, 1)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    assert cache.get_seq_length() == 4


class _Module(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


@pytest.mark.unit
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_one_query_attention_equals_sdpa(mask_kind):
    """Grouped query heads over their key/value head, masked as SDPA's masks say."""
    generator = torch.Generator().manual_seed(1)
    batch, heads, kv_heads, keys, dim = 3, 9, 3, 37, 16
    query = torch.randn(batch, heads, 1, dim, generator=generator)
    key = torch.randn(batch, kv_heads, keys, dim, generator=generator)
    value = torch.randn(batch, kv_heads, keys, dim, generator=generator)
    mask = None
    if mask_kind != "none":
        allowed = torch.ones(batch, 1, 1, keys, dtype=torch.bool)
        allowed[0, ..., :5] = False  # a left-padded row
        allowed[2, ..., :30] = False
        mask = (
            allowed
            if mask_kind == "bool"
            else torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        )
    module = _Module()
    got, _ = attention.decode_attention(module, query, key, value, mask, scaling=0.3)
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert got.shape == want.shape == (batch, 1, heads, dim)
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.unit
@pytest.mark.parametrize("history", [0, 33])
def test_a_few_query_tokens_attend_causally_as_sdpa_does(history):
    """A short prompt (no history: transformers passes no mask, SDPA's is_causal), and a
    follow-up's new tokens after a reused history in a padded batch (SDPA's causal mask)."""
    from transformers.masking_utils import sdpa_mask

    generator = torch.Generator().manual_seed(3)
    batch, q = 2, 7
    keys = history + q
    query = torch.randn(batch, 9, q, 16, generator=generator)
    key, value = (torch.randn(batch, 3, keys, 16, generator=generator) for _ in range(2))
    mask = None
    if history:
        padding = torch.ones(batch, keys, dtype=torch.bool)
        padding[1, :6] = False  # the second row is shorter: padded on the left
        mask = sdpa_mask(
            batch_size=batch,
            q_length=q,
            kv_length=keys,
            q_offset=history,
            attention_mask=padding,
            allow_is_causal_skip=False,
        )
        assert mask is not None
    got, _ = attention.decode_attention(_Module(), query, key, value, mask, scaling=0.25)
    want, _ = sdpa_attention_forward(_Module(), query, key, value, mask, scaling=0.25)
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.unit
def test_a_long_prefill_goes_to_sdpa():
    generator = torch.Generator().manual_seed(2)
    tokens = attention.MAX_QUERY_TOKENS + 1
    query = torch.randn(1, 9, tokens, 8, generator=generator)
    key, value = (torch.randn(1, 3, tokens, 8, generator=generator) for _ in range(2))
    got, _ = attention.decode_attention(_Module(), query, key, value, None)
    want, _ = sdpa_attention_forward(_Module(), query, key, value, None)
    assert torch.equal(got, want)


@pytest.mark.integration
def test_the_real_model_decodes_alike_with_either_attention(backend):
    """A running batch of two rows of different lengths (so one is padded), stepped with the
    decode attention and with transformers' SDPA: the same logits at every step, within fp32
    rounding."""
    model = backend.model
    assert model.config._attn_implementation == attention.NAME
    requests = [
        backend.request([{"role": "user", "content": text}], max_new_tokens=12, min_new_tokens=12)
        for text in ("Hi", "Name three rivers of Europe and say where each one flows.")
    ]
    logits: dict[str, list[torch.Tensor]] = {}
    for implementation in ("sdpa", attention.NAME):
        model.set_attn_implementation(implementation)
        backend.prefix_store.clear()  # both runs compute the same prefills
        try:
            batch = backend.new_batch()
            seen: list[torch.Tensor] = []

            def recorded(*args, _forward=batch._forward, _seen=seen, **kwargs):
                logits = _forward(*args, **kwargs)
                _seen.append(logits.clone())  # before the row's processors edit it in place
                return logits

            batch._forward = recorded
            batch.add([backend.row(request, lambda text: None) for request in requests])
            while batch.rows:
                batch.step()
            logits[implementation] = seen
        finally:
            model.set_attn_implementation(attention.NAME)
        for request in requests:
            request.cancel.clear()
    assert len(logits["sdpa"]) == len(logits[attention.NAME]) >= 12
    for ours, theirs in zip(logits[attention.NAME], logits["sdpa"], strict=True):
        assert torch.allclose(ours, theirs, atol=2e-3)
