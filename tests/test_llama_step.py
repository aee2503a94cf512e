"""The fused decode step (chat/engine/local/llama_step.py, kernels/llama_step.cpp) against
transformers' forward, on the real model."""

from __future__ import annotations

import pytest
import torch

from chat.engine.local import llama_step
from chat.engine.local.kv_cache import HEADROOM
from chat.engine.local.threads import ThreadPlan
from chat.engine.weights.blockquant import BlockQuantLinear

PROMPTS = (
    "Hi",
    "Name three rivers of Europe and say where each one flows.",
    "Write a short poem about the sea at night.",
)
# A newcomer long enough to be prefilled in chunks while the others decode.
NEWCOMER = "Summarise the history of the printing press. " * 30
NEWCOMER_AT = 5  # the step before which it joins


def _drive(backend, fused: bool, replay: list[torch.Tensor] | None):
    """Step a batch through rows of different lengths (so some are padded), a newcomer
    prefilled a chunk a step while they decode, rows ending at different steps and one
    answer past a KV buffer's reallocation. Returns every forward pass's logits, the KV cache
    at NEWCOMER_AT + 20 steps, and the decode steps the fused step computed.

    With `replay` (the other run's logits) each pass returns those instead of its own, so both
    runs choose the same tokens and compute the same passes whatever rounding decides."""
    lengths = (HEADROOM + 12, 30, 9)
    requests = [
        backend.request([{"role": "user", "content": text}], max_new_tokens=n, min_new_tokens=n)
        for text, n in zip(PROMPTS, lengths, strict=True)
    ]
    newcomer = backend.request(
        [{"role": "user", "content": NEWCOMER}], max_new_tokens=6, min_new_tokens=6
    )
    backend.prefix_store.clear()  # both runs compute the same prefills
    batch = backend.new_batch()
    batch.fused_step = fused
    seen: list[torch.Tensor] = []
    fused_steps = fused_prefills = 0

    def recorded(ids, mask, cache, _forward=batch._forward):
        nonlocal fused_steps, fused_prefills
        if batch._llama_step is not None:
            fused_steps += ids.shape[1] == 1
            fused_prefills += ids.shape[1] > 1
        logits = _forward(ids, mask, cache)
        seen.append(logits.clone())  # before a row's processors edit it in place
        return replay[len(seen) - 1].clone() if replay is not None else logits

    batch._forward = recorded
    batch.add([backend.row(request, lambda text: None) for request in requests])
    kv = None
    steps = 0
    while batch.rows or batch.pending:
        if steps == NEWCOMER_AT:
            batch.add([backend.row(newcomer, lambda text: None)])
        batch.step()
        steps += 1
        if steps == NEWCOMER_AT + 20:
            # Only the columns the mask lets tokens attend to: a padding token's key and value
            # are never read, and transformers' forward and the step make different ones.
            used = batch.mask.bool()[:, None, :, None]
            kv = [(layer.keys * used, layer.values * used) for layer in batch.cache.layers]
    for request in [*requests, newcomer]:
        request.cancel.clear()
    return seen, kv, fused_steps, fused_prefills


@pytest.mark.integration
def test_the_fused_step_computes_what_transformers_computes(backend):
    """The same logits at every forward pass, within fp32 rounding, and the same KV cache.

    With fp32 activations (`gguf`, the default) only: with llama.cpp's int8 ones (`gguf-q8`) a
    relative change of 1e-6 in the embeddings moved the logits by 1.25 on this model (each
    activation is rounded to one of 255 steps, and a rounding that flips moves the step's
    result by a step), so two correct implementations agree no better than that. Both paths
    call the same kernels (tests/test_blockquant.py), and the step reads each linear's flag
    (the next test)."""
    blocks = [m for m in backend.model.modules() if isinstance(m, BlockQuantLinear)]
    assert blocks and not any(m.int8_activations for m in blocks), "expected the gguf weights"
    fused, fused_kv, fused_steps, fused_prefills = _drive(backend, fused=True, replay=None)
    eager, eager_kv, eager_fused, eager_prefills = _drive(backend, fused=False, replay=fused)
    assert eager_fused == eager_prefills == 0
    assert fused_prefills >= 1  # the three rows' padded prefill (the newcomer's is in chunks)
    # Every decode step was fused: the longest answer's HEADROOM + 12 tokens, the first of
    # which came from its prefill.
    assert fused_steps >= HEADROOM + 11
    assert len(fused) == len(eager) > fused_steps
    for index, (ours, theirs) in enumerate(zip(fused, eager, strict=True)):
        assert ours.shape == theirs.shape
        assert torch.allclose(ours, theirs, atol=2e-3, rtol=0), (index, (ours - theirs).abs().max())
    assert fused_kv is not None and len(fused_kv) == len(eager_kv)
    for (keys, values), (their_keys, their_values) in zip(fused_kv, eager_kv, strict=True):
        assert keys.shape == their_keys.shape
        assert torch.allclose(keys, their_keys, atol=1e-3, rtol=0)
        assert torch.allclose(values, their_values, atol=1e-3, rtol=0)


@pytest.mark.integration
def test_swapped_or_changed_linears_rebuild_the_step(backend):
    """The step reads the linears' tensors and flags as they were when it was built: a change
    seen when newcomers join builds it again."""
    batch = backend.new_batch()
    batch._use_weights()
    first = batch._llama_step
    assert first is not None
    batch._use_weights()
    assert batch._llama_step is first
    head = backend.model.lm_head
    head.int8_activations = not head.int8_activations
    try:
        batch._use_weights()
        assert batch._llama_step is not None and batch._llama_step is not first
    finally:
        head.int8_activations = not head.int8_activations


@pytest.mark.integration
def test_a_model_the_step_does_not_compute_keeps_transformers_forward(float_backend):
    step, why = llama_step.prepare(float_backend.model)
    assert step is None and "GGUF blocks" in why
    request = float_backend.request(
        [{"role": "user", "content": "Hi"}], max_new_tokens=3, min_new_tokens=3
    )
    result = float_backend.generate(request)
    assert result.new_tokens == 3


@pytest.mark.unit
def test_a_cache_the_step_cannot_write_is_left_to_transformers():
    """A plain DynamicCache (not the growing one) or one of another depth: None, not a guess."""
    from transformers import DynamicCache

    step = llama_step.LlamaStep(step=None, layers=30)
    cache = DynamicCache()
    cache.update(torch.zeros(1, 3, 4, 64), torch.zeros(1, 3, 4, 64), 0)
    assert step(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 5), cache) is None


@pytest.mark.integration
def test_helpers_change_nothing_but_the_time(backend, monkeypatch):
    """The step's chunks are computed the same way whichever thread takes them: with three
    helpers (more than this machine has cores, so they are often held off and the calling thread
    takes their share) the logits are the very ones of the step on one thread, bit for bit,
    through joins, leaves and a newcomer prefilled in chunks."""
    runs = []
    for threads in (1, 4):  # a step on its own thread, then with three helpers
        plan = ThreadPlan(threads, 1)
        # torch's own operators (the prefills) on one thread in both runs: with more, oneDNN may
        # block a reduction differently (it did on an AMX Xeon), which is not the step's doing.
        monkeypatch.setattr(plan, "use", lambda tokens: torch.set_num_threads(1))
        monkeypatch.setattr(backend, "threads", plan)
        probe = backend.new_batch()
        probe._use_weights()
        assert probe._llama_step is not None and probe._llama_step._step.helpers == threads - 1
        runs.append(_drive(backend, fused=True, replay=None))
    (alone, alone_kv, *_), (helped, helped_kv, *_) = runs
    assert len(alone) == len(helped)
    for ours, theirs in zip(helped, alone, strict=True):
        assert torch.equal(ours, theirs)
    for (keys, values), (their_keys, their_values) in zip(helped_kv, alone_kv, strict=True):
        assert torch.equal(keys, their_keys) and torch.equal(values, their_values)


@pytest.mark.integration
def test_step_eager_keeps_transformers_forward(backend):
    """CHAT_ENGINE step=eager: no fused step is built, and the load line and the answers'
    identity say so."""
    from dataclasses import replace

    from chat.engine.local.backend import LocalBackend

    eager = object.__new__(LocalBackend)
    eager.__dict__.update(backend.__dict__)
    eager.config = replace(backend.config, step="eager")
    eager._identity = None
    batch = eager.new_batch()
    batch._use_weights()
    assert batch._llama_step is None
    assert "step=eager" in eager.describe_step()
    assert eager.model_identity()["step"] == "eager"
    assert backend.model_identity()["step"] == "fused"
    assert "one C++ call" in backend.describe_step()
