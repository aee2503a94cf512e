"""Threads per forward pass: every core for a prefill and a fused decode step, one fewer for
transformers' decode step."""

from __future__ import annotations

import pytest
import torch

from chat.engine.local.threads import DECODE_TOKENS, TORCH_DEFAULT, ThreadPlan


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.unit
def test_decode_steps_leave_a_core_and_prefills_take_them_all():
    assert (ThreadPlan.configured(4).prefill, ThreadPlan.configured(4).decode) == (4, 3)
    assert (ThreadPlan.configured(1).prefill, ThreadPlan.configured(1).decode) == (1, 1)
    assert ThreadPlan.configured(4, decode=4).decode == 4  # CHAT_DECODE_THREADS overrides
    assert ThreadPlan.configured().prefill == TORCH_DEFAULT
    # The fused step: its own thread and a helper per further core.
    assert ThreadPlan.configured(4).step_helpers == 3
    assert ThreadPlan.configured(1).step_helpers == 0


@pytest.mark.unit
def test_a_forward_pass_gets_the_threads_its_size_asks_for(torch_threads):
    plan = ThreadPlan(prefill=2, decode=1)
    plan.use(DECODE_TOKENS)
    assert torch.get_num_threads() == 1
    plan.use(DECODE_TOKENS + 1)
    assert torch.get_num_threads() == 2
    plan.use(1)
    assert torch.get_num_threads() == 1


@pytest.mark.integration
def test_the_running_batch_prefills_on_every_thread_and_decodes_on_fewer(backend, torch_threads):
    """What each forward pass of a real batch ran on through transformers' forward: the long
    prompt's prefill on the plan's prefill threads, every decode step on its decode threads."""
    batch = backend.new_batch()
    batch.threads = ThreadPlan(prefill=2, decode=1)
    batch.fused_step = False  # the fused step's own threads: tests/test_llama_step.py
    seen: list[tuple[int, int]] = []
    forward = batch.model.forward

    def recorded(*args, **kwargs):
        seen.append((kwargs["input_ids"].numel(), torch.get_num_threads()))
        return forward(*args, **kwargs)

    batch.model.forward = recorded
    try:
        prompt = "Summarise the history of the printing press in Europe in a few sentences."
        request = backend.request(
            [{"role": "user", "content": prompt}], max_new_tokens=4, min_new_tokens=4
        )
        backend.prefix_store.clear()  # the whole prompt is prefilled, not reused
        batch.add([backend.row(request, lambda text: None)])
        while batch.rows:
            batch.step()
    finally:
        del batch.model.forward
    assert seen[0][0] > DECODE_TOKENS and seen[0][1] == 2
    assert len(seen) >= 2 and all(threads == 1 for tokens, threads in seen[1:])
