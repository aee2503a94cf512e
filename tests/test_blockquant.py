"""GGUF block-quantized linears (chat/engine/weights/blockquant.py) and the "gguf" weight mode.

The kernels are compiled C++ (chat/engine/weights/kernels/blockquant.cpp): every test here compares them
with the float matmul of the weight the blocks stand for, on random blocks and on the bundled
model, so a wrong shift, sign or stride fails loudly. They run the instruction set this CPU
compiles (AVX-512 or AVX2; `isa()` says which); `blockquant.build("avx2")` builds the AVX2
kernels on an AVX-512 CPU.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from chat.engine.weights import blockquant, gguf_blocks, quant_choice, quantized
from chat.engine.weights.blockquant import BlockQuantLinear
from chat.engine.weights.loading import bundled_gguf_path

supported, why = blockquant.cpu_supported()
pytestmark = [
    pytest.mark.integration,  # builds (or loads) a native extension
    pytest.mark.skipif(not supported, reason=f"block-quant kernels need AVX2: {why}"),
]


@pytest.fixture(scope="module")
def kernels():
    built = blockquant.kernels()
    assert built is not None, blockquant.failure()  # on an AVX2 CPU a failed build is a bug
    return built


def _q4_1(out_features: int, in_features: int, seed: int = 0) -> BlockQuantLinear:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out_features, in_features), generator=generator)
    d = torch.rand(out_features, in_features // 32, generator=generator) * 0.02
    m = -torch.rand(out_features, in_features // 32, generator=generator) * 0.1
    return BlockQuantLinear.q4_1(q, d, m)


def _q8_0(out_features: int, in_features: int, seed: int = 0) -> BlockQuantLinear:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out_features, in_features), generator=generator)
    d = torch.rand(out_features, in_features // 32, generator=generator) * 0.02
    return BlockQuantLinear.q8_0(q, d)


def _q8_0_by_16(out_features: int, in_features: int, seed: int = 0) -> BlockQuantLinear:
    """Q8_0 values with a scale per 16 weights: the layout a file's Q6_K rows are widened to."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(-32, 32, (out_features, in_features), generator=generator)
    d = (torch.rand(out_features, in_features // 16, generator=generator) - 0.5) * 0.2
    return BlockQuantLinear.q8_0(q, d)


@pytest.mark.parametrize("make", [_q4_1, _q8_0, _q8_0_by_16], ids=["q4_1", "q8_0", "q8_0/16"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 16, blockquant.MAX_KERNEL_ROWS + 3])
@pytest.mark.parametrize("int8_activations", [False, True], ids=["fp32-act", "int8-act"])
def test_a_block_linear_computes_with_the_weight_its_blocks_stand_for(
    kernels, make, rows, int8_activations
):
    layer = make(97, 160)  # an odd count of weight rows: a tile's leftover row
    layer.int8_activations = int8_activations
    hidden = torch.randn(rows, 1, 160, generator=torch.Generator().manual_seed(rows))
    got = layer(hidden)
    want = hidden @ layer.weight_float().t()
    assert got.shape == (rows, 1, 97) and got.dtype == torch.float32
    relative = ((got - want).abs().max() / want.abs().max()).item()
    if int8_activations and rows <= blockquant.MAX_KERNEL_ROWS:
        assert relative < 2e-2  # int8 activations: about 5e-3 measured
    else:
        assert relative < 1e-5  # fp32 all the way: only the summation order differs


def test_the_kernels_are_built_for_the_instruction_set_the_cpu_has(kernels):
    flags = blockquant.cpu_flags()
    expected = "avx2"
    if all(flag in flags for flag in ("avx512f", "avx512bw", "avx512vl", "avx512dq")):
        expected = "avx512-vnni" if "avx512_vnni" in flags else "avx512"
    assert kernels.isa() == expected == blockquant.isa_level()
    assert f"-{expected}-" in blockquant.build_directory().name
    # One build per checkout: another checkout's sources are another build, not a rebuild.
    assert blockquant.build_directory().name.endswith(
        hashlib.sha256(str(blockquant.KERNELS.resolve()).encode()).hexdigest()[:8]
    )


def test_isa_level_reads_the_flags_and_never_rises_above_them():
    avx2 = ["fma", "avx2", "f16c"]
    avx512 = [*avx2, "avx512f", "avx512bw", "avx512vl", "avx512dq"]
    assert blockquant.isa_level(avx2) == "avx2"
    assert blockquant.isa_level([*avx512[:-1]]) == "avx2"  # no avx512dq: not the AVX-512 build
    assert blockquant.isa_level(avx512) == "avx512"
    assert blockquant.isa_level([*avx512, "avx512_vnni"]) == "avx512-vnni"
    assert "-mavx512vnni" in blockquant.compiler_flags("avx512-vnni")
    assert not any("512" in flag for flag in blockquant.compiler_flags("avx2"))
    assert blockquant.isa_level([*avx512, "avx512_vnni"], wanted="avx2") == "avx2"
    assert blockquant.isa_level(avx2, wanted="avx512") == "avx2"


@pytest.mark.parametrize(("rows", "in_features"), [(1, 32), (3, 96), (7, 1536)])
def test_block_sums_of_x_are_summed_in_cpp(kernels, rows, in_features):
    """AVX2's Q4_1 offsets are m * (a block's sum of x), summed in C++ once per call."""
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(in_features)) - 0.5
    want = x.double().reshape(rows, -1, 32).sum(-1)
    torch.testing.assert_close(kernels.block_sums(x).double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("rows", "in_features"), [(1, 32), (3, 96), (7, 1536)])
def test_q4_1_offsets_weigh_each_blocks_sum_of_x(kernels, rows, in_features):
    """q = 0 everywhere: the output is the offsets alone, sum over blocks of m * sum(x), which a
    wrong block sum (or a table entry for q = 0 other than m) gets wrong."""
    generator = torch.Generator().manual_seed(rows)
    out_features = 37  # odd: tiles of two weight rows and a single one left
    m = torch.randn(out_features, in_features // 32, generator=generator)
    q = torch.zeros(out_features, in_features, dtype=torch.long)
    layer = BlockQuantLinear.q4_1(q, torch.rand(m.shape, generator=generator), m)
    x = torch.randn(rows, in_features, generator=generator) - 1.0
    want = x.double().reshape(rows, -1, 32).sum(-1) @ m.double().t()
    torch.testing.assert_close(layer(x).double(), want, rtol=1e-5, atol=1e-4)


def test_q4_1_packing_keeps_ggml_order(kernels):
    """Element j of a block is the low nibble of byte j, element j + 16 its high nibble."""
    q = torch.arange(64).remainder(16).reshape(1, 64).flip(1)
    layer = BlockQuantLinear.q4_1(q, torch.ones(1, 2), torch.zeros(1, 2))
    assert torch.equal(layer.weight_float(), q.float())
    assert layer.qs[0, 0].item() == (q[0, 0] | (q[0, 16] << 4)).item()


def test_blocks_refuse_activations_that_do_not_fit(kernels):
    with pytest.raises(RuntimeError, match="weight blocks do not match in_features"):
        kernels.q4_1_mm(
            torch.randn(1, 64), _q4_1(8, 96).qs, torch.ones(8, 2), torch.ones(8, 2), False
        )


def test_an_unsupported_cpu_gives_a_reason_and_forcing_gguf_says_it(monkeypatch):
    monkeypatch.setattr(blockquant, "_kernels", None)
    monkeypatch.setattr(blockquant, "_failure", None)
    monkeypatch.setattr(blockquant, "cpu_supported", lambda: (False, "this CPU lacks avx2"))
    model = _Tiny()
    with pytest.raises(ValueError, match="CHAT_ENGINE quant=gguf: this CPU lacks avx2"):
        quant_choice.choose(model, "gguf", lambda: 1.0)
    assert type(model.up) is nn.Linear


class _Tiny(nn.Module):
    device = torch.device("cpu")

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 64, bias=False)

    def get_output_embeddings(self):
        return None


@pytest.mark.parametrize(
    ("seconds", "kept"), [({"none": 1.0, "gguf": 0.5}, True), ({"none": 1.0, "gguf": 0.95}, False)]
)
def test_auto_keeps_gguf_only_when_its_timed_steps_are_faster(kernels, seconds, kept):
    model = _Tiny()
    order = iter(["none", "gguf"])
    line = quant_choice.choose(model, "auto", lambda: seconds[next(order)])
    assert "gguf 500 ms" in line or "gguf 950 ms" in line
    if kept:
        assert line.startswith("weights gguf (auto)") and isinstance(model.up, BlockQuantLinear)
        assert model.up.kind == "q4_1" and not model.up.int8_activations
    else:
        assert line.startswith("weights not quantized (auto)") and type(model.up) is nn.Linear


# -- on the real model ---------------------------------------------------------------------


def test_the_gguf_files_blocks_are_read_as_stored_and_match_the_model(float_backend, kernels):
    layers = gguf_blocks.gguf_block_layers(bundled_gguf_path(), float_backend.model)
    config = float_backend.model.config
    assert len(layers) == 7 * config.num_hidden_layers + 1  # every projection, and the head
    kinds = {layer.kind for name, layer in layers.items() if name != "lm_head"}
    assert kinds == {"q4_1"} and layers["lm_head"].kind == "q8_0"
    for name in ("model.layers.3.self_attn.q_proj", "model.layers.7.self_attn.k_proj", "lm_head"):
        module = float_backend.model.get_submodule(name)
        weight = module.linear.weight if hasattr(module, "linear") else module.weight
        # The converted model is these very blocks rounded to bf16 (q/k rows un-permuted).
        torch.testing.assert_close(
            layers[name].weight_float(), weight.float(), rtol=1e-2, atol=2e-3
        )


@pytest.mark.parametrize("int8_activations", [False, True], ids=["gguf", "gguf-q8"])
def test_gguf_mode_keeps_the_models_predictions(float_backend, kernels, int8_activations):
    """Same next-token choice on a real prompt, logits close; then the layers go back."""
    ids = torch.tensor([float_backend.encode([{"role": "user", "content": "Name three fruits."}])])
    with torch.inference_mode():
        before = float_backend.model(ids).logits[0, -1]
        undo, from_file = gguf_blocks.quantize_blocks(
            float_backend.model, gguf_path=bundled_gguf_path(), int8_activations=int8_activations
        )
        try:
            assert from_file == 211
            # The prompt's last token through the decode-step kernels (one row, int8 activations).
            cache_ids = ids[:, :-1]
            out = float_backend.model(cache_ids, use_cache=True)
            after = float_backend.model(ids[:, -1:], past_key_values=out.past_key_values).logits[
                0, -1
            ]
        finally:
            quantized.restore(undo)
    assert after.argmax() == before.argmax()
    kl = torch.nn.functional.kl_div(
        after.log_softmax(-1), before.log_softmax(-1), log_target=True, reduction="sum"
    )
    assert kl.item() < 0.05
    assert not any(isinstance(m, BlockQuantLinear) for m in float_backend.model.modules())


def test_a_stream_in_gguf_mode_runs_through_the_engine(float_backend, kernels):
    undo, _ = gguf_blocks.quantize_blocks(float_backend.model, gguf_path=bundled_gguf_path())
    try:
        chunks: list[str] = []
        request = float_backend.request(
            [{"role": "user", "content": "Say hello."}], max_new_tokens=12, min_new_tokens=12
        )
        batch = float_backend.new_batch()
        batch.add([float_backend.row(request, chunks.append)])
        for _ in range(40):
            batch.step()
            if not len(batch):
                break
    finally:
        quantized.restore(undo)
    assert "".join(chunks).strip()


def test_the_files_blocks_are_kept_beside_the_model_and_read_back_the_same(
    float_backend, kernels, monkeypatch
):
    first = gguf_blocks.gguf_block_layers(bundled_gguf_path(), float_backend.model)
    cache = gguf_blocks._block_cache_path(bundled_gguf_path(), float_backend.model)
    assert cache is not None and cache.exists()
    monkeypatch.setattr(
        gguf_blocks, "_read_gguf_block_layers", lambda *a: pytest.fail("read the GGUF again")
    )
    again = gguf_blocks.gguf_block_layers(bundled_gguf_path(), float_backend.model)
    assert again.keys() == first.keys()
    for name, layer in first.items():
        assert (again[name].kind, again[name].in_features) == (layer.kind, layer.in_features)
        assert torch.equal(again[name].weight_float(), layer.weight_float())


def test_a_model_built_around_the_kept_blocks_is_the_float_model_swapped(float_backend, kernels):
    """around_blocks.py: the same tensors, name for name, and the same logits bit for bit as the
    float model with its linears swapped for the file's blocks, without the float linears."""
    from transformers import AutoModelForCausalLM

    from chat.engine.local import attention
    from chat.engine.weights.around_blocks import load_around_blocks

    folder = float_backend.model.config._name_or_path
    gguf_blocks.gguf_block_layers(bundled_gguf_path(), float_backend.model)  # kept, if not yet
    built = load_around_blocks(
        folder,
        gguf_path=bundled_gguf_path(),
        dtype=torch.float32,
        attn_implementation=attention.NAME,
    )
    assert built is not None
    lean, from_file = built
    assert from_file == 211
    swapped = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation=attention.NAME
    ).eval()
    gguf_blocks.quantize_blocks(swapped, gguf_path=bundled_gguf_path())
    ours, theirs = lean.state_dict(), swapped.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    assert not any(type(module) is torch.nn.Linear for module in lean.modules())
    assert lean.generation_config.eos_token_id == swapped.generation_config.eos_token_id
    ids = torch.tensor([float_backend.encode([{"role": "user", "content": "Name a river."}])])
    with torch.inference_mode():
        assert torch.equal(lean(input_ids=ids).logits, swapped(input_ids=ids).logits)


def test_without_kept_blocks_the_model_is_loaded_whole(float_backend, kernels, tmp_path):
    """A folder whose blocks were never kept (or a model the blocks do not cover): None, and the
    loader reads the float model and the GGUF as before."""
    import shutil

    from chat.engine.local import attention
    from chat.engine.weights.around_blocks import load_around_blocks

    folder = Path(float_backend.model.config._name_or_path)
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("gguf-blocks-*"))
    options = {"dtype": torch.float32, "attn_implementation": attention.NAME}
    assert load_around_blocks(copy, gguf_path=bundled_gguf_path(), **options) is None
    kept = gguf_blocks.block_cache_path(bundled_gguf_path(), folder)
    assert kept is not None and kept.exists()
    # Blocks kept for fewer projections than the model has: not a partial model either.
    parts = torch.load(kept, weights_only=True)
    parts.pop("lm_head")
    torch.save(parts, gguf_blocks.block_cache_path(bundled_gguf_path(), copy))
    assert load_around_blocks(copy, gguf_path=bundled_gguf_path(), **options) is None


def test_a_build_killed_midway_does_not_hold_the_next_start():
    """torch's builder waits for ever on the lock file a killed build leaves; a start must not."""
    directory = blockquant.build_directory()
    leftover = directory / "lock"
    leftover.touch()
    code = (
        "from chat.engine.weights import blockquant\n"
        "print(blockquant.build(blockquant.isa_level()).isa())"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        held = leftover.exists()
        leftover.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.strip() == blockquant.isa_level()
    assert not held
