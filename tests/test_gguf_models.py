"""A `.gguf` file as the model (CHAT_MODEL_PATH): tiny random Llama and Qwen2 files written with
gguf's GGUFWriter (tests/gguf_models.py), every block type in one mixed file or another.

The reference is transformers' own forward on the float model it builds from the same file (its
GGUF loader dequantizes with gguf's numpy code and un-permutes Llama's q/k): the engine's model,
with the file's blocks in its linears and the fused decode step, must give the same logits.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from unittest import mock

import pytest
import torch
import websockets

from chat.engine.local import llama_step
from chat.engine.local.loader import load_backend
from chat.engine.types import EngineConfig
from chat.engine.weights import blockquant, gguf_file
from chat.engine.weights.blockquant import BlockQuantLinear
from tests import gguf_models
from tests.conftest import LIVE_CACHE_URL, chunks_text

supported, why = blockquant.cpu_supported()
needs_kernels = pytest.mark.skipif(not supported, reason=f"block-quant kernels need AVX2: {why}")
Q = gguf_models.Q
# Longer than MAX_KERNEL_ROWS in the tiny models' byte tokens: a prefill takes both paths.
PROMPT = [
    {
        "role": "user",
        "content": "hi there, tell me a story about the lighthouse keeper who counted ships "
        "passing in the night and wrote each name down in a book that nobody ever read",
    }
]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tmp_path_factory):
    """(backend, transformers' float model) for one tiny file."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp(request.param)
    path = gguf_models.write_model(folder / f"tiny-{request.param}.gguf", request.param, theta=5e4)
    config = EngineConfig(model_path=str(path), data_dir=str(folder / "data"), quant="gguf")
    # Built around the file's blocks: transformers' float model (every weight in fp32) never is.
    never = mock.patch.object(
        gguf_file, "load_model_and_tokenizer", side_effect=AssertionError("float model built")
    )
    with never:
        backend = load_backend(config, progress=lambda line: None)
    reference = AutoModelForCausalLM.from_pretrained(
        str(folder), gguf_file=path.name, dtype=torch.float32
    ).eval()
    return backend, reference


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.integration
@needs_kernels
def test_the_file_alone_gives_the_model_its_shape_tokenizer_template_and_blocks(tiny):
    backend, reference = tiny
    model = backend.model
    assert type(model).__name__ == type(reference).__name__
    assert model.config.rope_parameters["rope_theta"] == 5e4
    assert model.config.num_key_value_heads == gguf_models.KV_HEADS
    linears = [model.lm_head, *llama_step._projections(model.model)]
    assert all(type(linear) is BlockQuantLinear for linear in linears)
    kinds = {linear.kind for linear in linears}
    # A mixed file, per tensor as it comes: eight types, Q5_0, Q4_K and Q6_K in Q8_0's and Q4_1's
    # layouts (Q6_K's with a scale per 16 weights).
    assert kinds == {"q4_0", "q4_1", "q5_1", "q5_k", "q8_0"}
    assert any(
        linear.kind == "q8_0" and linear.d.shape[1] * 16 == linear.in_features for linear in linears
    )
    if type(model).__name__ == "Qwen2ForCausalLM":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    rendered = backend.render(PROMPT)
    assert rendered.startswith("<|im_start|>user\nhi there") and rendered.endswith(
        "<|im_start|>assistant\n"
    )
    assert backend.tokenizer.eos_token == "<|im_end|>"
    assert llama_step.unsupported(model) == ""
    assert backend.describe_step().startswith("one C++ call")


@pytest.mark.integration
@needs_kernels
@pytest.mark.parametrize("step_isa", ["native", "avx2"])
def test_its_logits_are_transformers_forward_on_the_same_weights(tiny, step_isa, monkeypatch):
    """A prefill through the kernels (up to MAX_KERNEL_ROWS tokens) and through the dequantized
    GEMM (more), then decode steps through the fused C++ step (built from the kernels this CPU
    compiles, or from the AVX2 build), each against transformers' float forward."""
    backend, reference = tiny
    if step_isa == "avx2":
        avx2 = blockquant.build("avx2")
        monkeypatch.setattr(llama_step, "kernels", lambda: avx2)
    ids = torch.tensor([backend.encode(PROMPT)])
    assert ids.shape[1] > blockquant.MAX_KERNEL_ROWS
    with torch.no_grad():
        for width in (blockquant.MAX_KERNEL_ROWS, ids.shape[1]):
            got = backend.model(ids[:, :width]).logits
            assert relative(got, reference(ids[:, :width]).logits) < 1e-4

    fed: list[int] = []
    decoded: list[torch.Tensor] = []
    backend.prefix_store.clear()  # the whole prompt prefilled, whichever test ran before
    batch = backend.new_batch()
    forward = batch._forward

    def recorded(step_ids, mask, cache):
        logits = forward(step_ids, mask, cache)
        if step_ids.shape[1] == 1:
            assert batch._llama_step is not None  # the fused step, not transformers' forward
            fed.append(int(step_ids[0, 0]))
            decoded.append(logits.reshape(-1).clone())
        return logits

    batch._forward = recorded
    request = backend.request(PROMPT, max_new_tokens=6, min_new_tokens=6)
    batch.add([backend.row(request, lambda text: None)])
    while batch.rows or batch.pending:
        batch.step()
    assert len(decoded) == 5
    with torch.no_grad():
        for step, logits in enumerate(decoded):
            context = torch.cat([ids, torch.tensor([fed[: step + 1]])], dim=1)
            want = reference(context).logits[0, -1]
            assert relative(logits, want) < 1e-4


@pytest.mark.integration
@needs_kernels
def test_a_file_with_float_projections_loads_the_float_model_and_swaps_the_rest(tmp_path):
    """F16 projections keep transformers' float linears (built from the whole float model); the
    file's block tensors are still swapped in, and the logits are transformers' forward."""
    from transformers import AutoModelForCausalLM

    mix = {**gguf_models.LLAMA_MIX, "attn_v": Q.F16, "ffn_up": Q.F16}
    path = gguf_models.write_model(tmp_path / "half-float.gguf", "llama", mix=mix)
    # Weight-major's timed choice could wrap the float linears: off, so the test reads the swap.
    config = EngineConfig(
        model_path=str(path), data_dir=str(tmp_path / "data"), quant="gguf", weight_major="off"
    )
    lines: list[str] = []
    backend = load_backend(config, progress=lines.append)
    layer = backend.model.model.layers[0]
    assert type(layer.self_attn.v_proj) is torch.nn.Linear
    assert type(layer.self_attn.q_proj) is BlockQuantLinear
    assert any("linears from the file's blocks" in line for line in lines), lines
    reference = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = torch.tensor([backend.encode(PROMPT)])
    with torch.no_grad():
        assert relative(backend.model(ids).logits, reference(ids).logits) < 1e-4


@pytest.mark.integration
@needs_kernels
async def test_an_answer_streams_over_a_real_socket_from_a_gguf_file(tmp_path):
    """A daphne whose CHAT_MODEL_PATH is a tiny Qwen2 file, and a real WebSocket client:
    accepted, chunks, done, the chunks being the answer."""
    from harness.liveserver import LiveServer

    path = gguf_models.write_model(tmp_path / "tiny-qwen2.gguf", "qwen2")
    (tmp_path / "live").mkdir()
    server = LiveServer(
        tmp_path / "live", CHAT_MODEL_PATH=str(path), CHAT_CACHE_REDIS_URL=LIVE_CACHE_URL
    ).start()
    try:
        async with websockets.connect(server.ws_url, origin=server.url) as ws:
            await ws.send(json.dumps({"type": "prompt", "request_id": "g1", "text": "hi there"}))
            events = []
            while not events or events[-1]["type"] not in {"done", "error"}:
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 120)))
    finally:
        server.stop()
    kinds = [event["type"] for event in events]
    assert kinds[0] == "accepted" and kinds[-1] == "done" and "chunk" in kinds, events[-1]
    assert chunks_text(events) == events[-1]["text"]
    assert events[-1]["finish_reason"] in {"eos", "length"}


def _unsupported_file(folder, architecture: str = "llama"):
    mix = {**gguf_models.LLAMA_MIX, "ffn_down": Q.Q2_K}
    return gguf_models.write_model(folder / "unsupported.gguf", architecture, mix=mix)


@pytest.mark.unit
def test_a_file_the_engine_cannot_run_is_one_error_naming_what(tmp_path):
    path = _unsupported_file(tmp_path)
    with pytest.raises(gguf_file.UnsupportedModelFile) as refused:
        gguf_file.check_runnable(path)
    message = str(refused.value)
    assert "Q2_K (2 tensors, e.g. blk.0.ffn_down.weight)" in message and "Q6_K" in message
    (tmp_path / "arch").mkdir()
    strange = gguf_models.write_model(tmp_path / "arch" / "strange.gguf", "nosucharch")
    with pytest.raises(gguf_file.UnsupportedModelFile, match="architecture 'nosucharch'"):
        gguf_file.check_runnable(strange)
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        gguf_file.check_runnable(tmp_path / "missing.gguf")


@pytest.mark.integration
def test_starting_on_a_file_the_engine_cannot_run_fails_before_loading(tmp_path):
    path = _unsupported_file(tmp_path)
    config = replace(EngineConfig(), model_path=str(path), data_dir=str(tmp_path / "data"))
    lines: list[str] = []
    with pytest.raises(gguf_file.UnsupportedModelFile, match="Q2_K"):
        load_backend(config, progress=lines.append)
    assert lines == []  # refused before anything was loaded
