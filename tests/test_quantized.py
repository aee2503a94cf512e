"""Weight-only quantized linears (chat/engine/weights/quantized.py): kernels, GGUF blocks
(gguf_blocks.py), the choice at load (quant_choice.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from chat.engine.weights import gguf_blocks, quant_choice, quantized, weight_major
from chat.engine.weights.loading import bundled_gguf_path
from chat.engine.weights.quantized import QuantLinear
from chat.engine.weights.start_choices import StartChoices, decisive

pytestmark = pytest.mark.skipif(
    not quantized.kernels_available(), reason="this torch has no weight-only CPU kernels"
)


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_a_quantized_linear_computes_with_the_weight_it_stands_for(kind, rows):
    torch.manual_seed(0)
    linear = nn.Linear(128, 96, bias=False)
    layer = getattr(QuantLinear, kind)(linear.weight)
    if kind == "int8":
        q, scales = quantized.int8_parts(linear.weight)
        weight = q.float() * scales[:, None]
    else:
        weight = quantized.int4_weight(*quantized.int4_parts(linear.weight))
    hidden = torch.randn(rows, 1, 128)
    got = layer(hidden)
    assert got.shape == (rows, 1, 96) and got.dtype == torch.float32
    torch.testing.assert_close(got, hidden @ weight.t(), rtol=1e-4, atol=1e-4)
    # And close to the float layer: int8 loses little, int4 more.
    error = (got - linear(hidden)).abs().max() / linear(hidden).abs().max()
    assert error < (0.02 if kind == "int8" else 0.2)


@pytest.mark.unit
def test_q4_1_blocks_are_read_as_ggml_lays_them_out():
    """d and m as fp16, then 16 bytes: low nibbles are elements 0..15, high ones 16..31."""
    torch.manual_seed(1)
    q = torch.randint(0, 16, (4, 64), dtype=torch.int32)
    d, m = torch.rand(4, 2).half(), (torch.rand(4, 2) - 1).half()
    blocks = []
    for row in range(4):
        for block in range(2):
            nibbles = q[row, block * 32 : block * 32 + 32]
            packed = (nibbles[:16] | (nibbles[16:] << 4)).to(torch.uint8)
            head = torch.stack([d[row, block], m[row, block]]).view(torch.uint8)
            blocks.append(torch.cat([head, packed]))
    data = torch.stack(blocks).reshape(4, 40)
    got_q, got_d, got_m = gguf_blocks.q4_1_nibbles(data, 64)
    assert torch.equal(got_q, q)
    assert torch.equal(got_d, d.float()) and torch.equal(got_m, m.float())


@pytest.mark.unit
@pytest.mark.parametrize("heads", [1, 3, 9])
def test_unpermuting_rows_undoes_llama_cpps_rotary_permutation(heads):
    rows = heads * 64
    original = torch.arange(rows)
    # convert_hf_to_gguf.py's permute(weights, n_head)
    permuted = original.reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(rows)
    assert torch.equal(permuted[gguf_blocks.unpermute_rows(rows, heads)], original)


# -- on the real model ---------------------------------------------------------------------


@pytest.mark.integration
def test_the_bundled_gguf_blocks_are_the_loaded_models_weights(float_backend):
    parts = gguf_blocks.gguf_q4_1_parts(bundled_gguf_path(), float_backend.model)
    config = float_backend.model.config
    assert len(parts) == 7 * config.num_hidden_layers  # every projection of every layer
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.5.self_attn.k_proj"):
        linear = float_backend.model.get_submodule(name)
        weight = linear.linear.weight if hasattr(linear, "linear") else linear.weight
        # The converted copy is these very blocks, rounded to bf16.
        torch.testing.assert_close(
            quantized.int4_weight(*parts[name]), weight.float(), rtol=2**-7, atol=1e-6
        )


@pytest.fixture
def int4_model(float_backend):
    """The session's model with int4 layers from the GGUF's blocks; put back afterwards."""
    blocks = gguf_blocks.gguf_int4_layers(bundled_gguf_path(), float_backend.model)
    undo, from_gguf = quantized.quantize(float_backend.model, "int4", gguf_blocks=blocks)
    assert from_gguf == 7 * float_backend.model.config.num_hidden_layers
    try:
        yield float_backend
    finally:
        quantized.restore(undo)


def _step_logits(model) -> torch.Tensor:
    ids = torch.tensor([[11], [222], [3333]])  # 3 rows x 1 token: a decode step's shape
    with torch.inference_mode():
        return model(input_ids=ids).logits[:, -1].float()


@pytest.mark.integration
def test_int4_logits_match_its_weights_in_float_and_stay_close_to_fp32(float_backend):
    """The kernel computes what its weights say (simulate), and those weights are close to fp32.

    Measured on the AVX2 EPYC: over a 96-token answer int4 vs fp32 max |dlogit| 0.8 (top-1
    100%), int8 vs fp32 1.4 (99%) (bench/scripts/quant_trial.py); on these one-token rows, whose
    logits span about 30, int4 vs fp32 2.2. Most of it is the int8 LM head.
    """
    model = float_backend.model
    fp32 = _step_logits(model)
    undo = quant_choice.simulate(model, "int4", gguf_path=bundled_gguf_path())
    simulated = _step_logits(model)
    quantized.restore(undo)
    blocks = gguf_blocks.gguf_int4_layers(bundled_gguf_path(), model)
    undo, _ = quantized.quantize(model, "int4", gguf_blocks=blocks)
    try:
        kernel = _step_logits(model)
    finally:
        quantized.restore(undo)
    torch.testing.assert_close(kernel, simulated, rtol=1e-3, atol=1e-2)
    assert (kernel - fp32).abs().max() < 3.0
    assert torch.equal(kernel.argmax(-1), fp32.argmax(-1))
    assert isinstance(model.get_output_embeddings(), nn.Module)
    assert torch.equal(_step_logits(model), fp32)  # restored: today's model again


@pytest.mark.integration
@pytest.mark.parametrize("wrapped", [False, True])
def test_int8_logits_stay_close_to_fp32_and_the_head_stays_int8(float_backend, wrapped):
    model = float_backend.model
    already = weight_major.unwrap_all(model)
    if wrapped:  # as CHAT_WEIGHT_MAJOR=auto may have left it before CHAT_ENGINE quant=auto
        weight_major.wrap(model)
    fp32 = _step_logits(model)
    undo, _ = quantized.quantize(model, "int8")
    try:
        int8 = _step_logits(model)
        head = model.get_output_embeddings()
        assert isinstance(head, QuantLinear) and head.kind == "int8"
        if model.config.tie_word_embeddings:  # the embedding still looks up its float table
            assert model.get_input_embeddings().weight.dtype == torch.float32
    finally:
        quantized.restore(undo)
        weight_major.unwrap_all(model)
        if already:
            weight_major.wrap(model)
    assert (int8 - fp32).abs().max() < 3.0
    assert torch.equal(int8.argmax(-1), fp32.argmax(-1))


@pytest.mark.integration
def test_an_int4_model_answers_greedily_with_real_text(int4_model):
    backend = int4_model
    request = backend.request(
        [{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=8
    )
    result = backend.generate(request)
    assert result.finish_reason in ("eos", "length")
    assert result.new_tokens >= 1 and result.text.strip()
    assert any(c.isalpha() for c in result.text)  # words, not noise; which words is the model's


# -- the choice at load ---------------------------------------------------------------------


class Tiny(nn.Module):
    """Two bias-free projections and a head: what `choose` looks for, in miniature."""

    device = torch.device("cpu")

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 128, bias=False)
        self.down = nn.Linear(128, 64, bias=False)
        self.head = nn.Linear(64, 32, bias=False)

    def get_output_embeddings(self):
        return self.head


def _layers(model) -> list[str]:
    return [type(layer).__name__ for layer in (model.up, model.down, model.head)]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        ({"none": 1.0, "int4": 0.5, "int8": 0.7}, "int4"),
        ({"none": 1.0, "int4": 0.8, "int8": 0.6}, "int8"),
        ({"none": 1.0, "int4": 0.95, "int8": 1.2}, "none"),  # within the margin: not worth it
    ],
)
def test_auto_keeps_the_mode_its_timed_steps_say_is_fastest(monkeypatch, seconds, expected):
    monkeypatch.setattr(quant_choice, "probe", lambda linear, layer: 1.0)
    monkeypatch.setattr(quant_choice, "AUTO_CANDIDATES", ("int4", "int8"))
    model = Tiny()
    order = iter(["none", *quant_choice.AUTO_CANDIDATES])
    line = quant_choice.choose(model, "auto", lambda: seconds[next(order)])
    assert f"{seconds['none'] * 1000:.0f} ms" in line
    if expected == "none":
        assert "not quantized" in line and _layers(model) == ["Linear"] * 3
    else:
        assert f"weights {expected} (auto)" in line
        assert {model.up.kind, model.down.kind} == {expected} and model.head.kind == "int8"


@pytest.mark.unit
def test_auto_does_not_time_a_kernel_the_probe_finds_slow(monkeypatch):
    monkeypatch.setattr(quant_choice, "probe", lambda linear, layer: 3.0)
    monkeypatch.setattr(quant_choice, "AUTO_CANDIDATES", ("int4", "int8"))
    model = Tiny()
    line = quant_choice.choose(model, "auto", lambda: pytest.fail("no step should be timed"))
    assert "not quantized" in line and "3.0x float on one row, not tried" in line
    assert _layers(model) == ["Linear"] * 3


@pytest.mark.unit
def test_auto_remembers_a_decisive_choice_and_the_next_start_on_that_machine_skips_the_timing(
    monkeypatch, tmp_path
):
    monkeypatch.setattr(quant_choice, "probe", lambda linear, layer: 1.0)
    monkeypatch.setattr(quant_choice, "AUTO_CANDIDATES", ("int4", "int8"))
    remembered = StartChoices(tmp_path / "start-choices.json")
    machine = {"cpu": "abc", "torch": "2.13.0", "threads": 2}
    seconds = iter([1.0, 0.5, 0.7])  # none, int4, int8: int4 wins clearly
    quant_choice.choose(
        Tiny(), "auto", lambda: next(seconds), remembered=remembered, machine=machine
    )

    model = Tiny()
    line = quant_choice.choose(
        model,
        "auto",
        lambda: pytest.fail("a remembered choice is not timed again"),
        remembered=remembered,
        machine=machine,
    )
    assert "weights int4 (auto, as measured before on this machine" in line
    assert model.up.kind == "int4" and model.head.kind == "int8"

    # Another CPU (or torch, threads, weights) is another key: measured again.
    timed = []
    other = {**machine, "cpu": "def"}
    quant_choice.choose(
        Tiny(), "auto", lambda: timed.append(1) or 1.0, remembered=remembered, machine=other
    )
    assert timed


@pytest.mark.unit
def test_a_close_call_is_not_remembered_and_a_damaged_file_only_costs_a_timing(
    monkeypatch, tmp_path
):
    monkeypatch.setattr(quant_choice, "probe", lambda linear, layer: 1.0)
    monkeypatch.setattr(quant_choice, "AUTO_CANDIDATES", ("int4",))
    path = tmp_path / "start-choices.json"
    remembered = StartChoices(path)
    seconds = iter([1.0, 0.9])  # none 1.0, int4 0.9: within DECISIVE, a noisy reading
    quant_choice.choose(Tiny(), "auto", lambda: next(seconds), remembered=remembered, machine={})
    assert not path.exists()

    path.write_text("{not json")
    seconds = iter([1.0, 0.5])
    line = quant_choice.choose(
        Tiny(), "auto", lambda: next(seconds), remembered=remembered, machine={}
    )
    assert "weights int4 (auto): decode steps" in line
    assert json.loads(path.read_text())["quant"]["value"]["mode"] == "int4"


@pytest.mark.unit
def test_decisive_needs_the_runner_up_clearly_slower():
    assert decisive({"none": 1.0, "gguf": 0.5})
    assert not decisive({"none": 1.0, "gguf": 0.9})
    assert decisive({"none": 1.0})


@pytest.mark.unit
def test_auto_tries_only_the_modes_that_passed_the_quality_gates():
    """gguf matched fp32's eos count; int8, int4 and gguf-q8 ended fewer (docs/benchmarks.md)."""
    assert quant_choice.AUTO_CANDIDATES == ("gguf",)


@pytest.mark.unit
def test_none_keeps_todays_layers_and_forced_modes_apply():
    model = Tiny()
    assert "CHAT_ENGINE quant=none" in quant_choice.choose(model, "none", lambda: 1.0)
    assert _layers(model) == ["Linear"] * 3
    quant_choice.choose(model, "int4", lambda: 1.0)
    assert [model.up.kind, model.down.kind, model.head.kind] == ["int4", "int4", "int8"]
    with pytest.raises(ValueError, match="use one of auto, none, int8, int4, gguf, gguf-q8"):
        quant_choice.choose(Tiny(), "int3", lambda: 1.0)


@pytest.mark.unit
def test_a_bad_chat_model_quant_stops_the_server_at_start_up():
    env = {**os.environ, "CHAT_ENGINE": "quant=fp4", "CHAT_BACKEND": "none"}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "CHAT_ENGINE quant='fp4': use auto, gguf, gguf-q8, int4, int8, none" in done.stderr
