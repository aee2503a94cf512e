"""Every GGUF block type's kernel against a reference nobody here wrote: numpy's matmul on the
weights `gguf.quants.dequantize` (llama.cpp's own Python package) makes of the same bytes.

The blocks are random but valid: `gguf.quants.quantize` of random weights for the types it can
write (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), random bytes with sane fp16 scales for the k-quants it
only reads (Q4_K, Q5_K, Q6_K). Each runs on the kernels this CPU compiles and on the AVX2 build
(`blockquant.build("avx2")`), which on an AVX-512 CPU is a second, different implementation.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from chat.engine.weights import blockquant
from chat.engine.weights.blockquant import BlockQuantLinear
from tests import gguf_models

Q = gguf.GGMLQuantizationType

supported, why = blockquant.cpu_supported()
pytestmark = [
    pytest.mark.integration,  # builds (or loads) a native extension
    pytest.mark.skipif(not supported, reason=f"block-quant kernels need AVX2: {why}"),
]

QUANTIZABLE = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
K_QUANTS = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
# Types computed in a faster kernel's layout, every weight unchanged (blockquant.from_gguf).
WIDENED = {Q.Q5_0: "q8_0", Q.Q4_K: "q4_1", Q.Q6_K: "q8_0"}
ISAS = ["native", "avx2"]


@pytest.fixture(scope="module")
def builds():
    native = blockquant.kernels()
    assert native is not None, blockquant.failure()  # on an AVX2 CPU a failed build is a bug
    return {"native": native, "avx2": blockquant.build("avx2")}


def file_rows(
    qtype: gguf.GGMLQuantizationType, out_features: int, in_features: int, seed: int
) -> np.ndarray:
    """uint8 [out, row bytes]: rows of valid blocks of `qtype`, as a GGUF file stores them."""
    rows = gguf_models.blocks(qtype, out_features, in_features, np.random.default_rng(seed))
    if qtype in QUANTIZABLE:  # an all-zero block too: its scale is 0
        rows[0] = gguf.quants.quantize(np.zeros((1, in_features), np.float32), qtype)[0]
    return rows


def reference(rows: np.ndarray, qtype: gguf.GGMLQuantizationType, x: np.ndarray) -> np.ndarray:
    weight = gguf.quants.dequantize(rows, qtype).astype(np.float64)
    return x.astype(np.float64) @ weight.T


def kernel_matmul(module, layer: BlockQuantLinear, x: torch.Tensor) -> torch.Tensor:
    """x @ W.T through one build's kernel for the layer's kind (never the prefill's GEMM)."""
    if layer.kind == "q4_1":
        return module.q4_1_mm(x, layer.qs, layer.d, layer.m, False)
    if layer.kind == "q8_0":
        return module.q8_0_mm(x, layer.qs, layer.d, False)
    return module.raw_mm(x, layer.qs, layer.ggml_type)


def relative_error(got: torch.Tensor, want: np.ndarray) -> float:
    return float(np.abs(got.double().numpy() - want).max() / np.abs(want).max())


@pytest.mark.parametrize("qtype", QUANTIZABLE + K_QUANTS, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 16])
def test_each_block_types_kernel_is_numpys_matmul_on_ggufs_dequantized_weights(
    builds, qtype, isa, rows
):
    in_features = 512  # two super-blocks of 256, sixteen blocks of 32
    out_features = 37  # an odd count: a chunk's leftover row
    data = file_rows(qtype, out_features, in_features, seed=int(qtype) * 100 + rows)
    layer = BlockQuantLinear.from_gguf(int(qtype), torch.from_numpy(data), in_features)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
    got = kernel_matmul(builds[isa], layer, x)
    want = reference(data, qtype, x.numpy())
    assert got.shape == (rows, out_features)
    assert relative_error(got, want) < 1e-5  # fp32 sums of the file's own weights
    if qtype in WIDENED:  # computed in another layout; the type's own kernel on the rows too
        stored = builds[isa].raw_mm(x, torch.from_numpy(data), int(qtype))
        assert relative_error(stored, want) < 1e-5
    if layer.kind == "q8_0":  # and llama.cpp's int8 activations (`gguf-q8`) on the layout
        int8 = builds[isa].q8_0_mm(x, layer.qs, layer.d, True)
        assert relative_error(int8, want) < 2e-2  # about 5e-3 measured


@pytest.mark.parametrize("qtype", QUANTIZABLE + K_QUANTS, ids=lambda t: t.name)
def test_a_block_linear_dequantizes_as_gguf_does_and_computes_a_prefill_with_it(builds, qtype):
    in_features, out_features = 256, 19
    data = file_rows(qtype, out_features, in_features, seed=int(qtype))
    bias = torch.randn(out_features)
    layer = BlockQuantLinear.from_gguf(int(qtype), torch.from_numpy(data), in_features, bias=bias)
    weight = gguf.quants.dequantize(data, qtype)
    np.testing.assert_allclose(layer.weight_float().numpy(), weight, rtol=1e-6, atol=1e-7)
    rows = blockquant.MAX_KERNEL_ROWS + 3  # a prefill chunk: the dequantized weight's GEMM
    x = torch.randn(rows, 1, in_features, generator=torch.Generator().manual_seed(1))
    got = layer(x)
    want = reference(data, qtype, x.reshape(rows, -1).numpy()) + bias.double().numpy()
    assert got.shape == (rows, 1, out_features)
    assert relative_error(got.reshape(rows, -1), want) < 1e-5
    decoding = layer(x[:2])  # and a decode step's rows through the kernel, bias included
    assert relative_error(decoding.reshape(2, -1), want[:2]) < 1e-5


@pytest.mark.parametrize("qtype", list(WIDENED), ids=lambda t: t.name)
def test_a_widened_type_keeps_every_weight_the_same_float(qtype):
    data = file_rows(qtype, 19, 512, seed=5)
    layer = BlockQuantLinear.from_gguf(int(qtype), torch.from_numpy(data), 512)
    assert layer.kind == WIDENED[qtype]
    assert np.array_equal(layer.weight_float().numpy(), gguf.quants.dequantize(data, qtype))


def test_rows_that_do_not_fit_their_type_are_refused(builds):
    data = torch.from_numpy(file_rows(Q.Q4_K, 4, 256, seed=0))
    with pytest.raises(ValueError, match="multiple of 256"):
        BlockQuantLinear.from_gguf(int(Q.Q4_K), data[:, :72], 128)
    with pytest.raises(ValueError, match="no block kernel"):
        BlockQuantLinear.from_gguf(int(Q.IQ4_NL), data, 256)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        builds["native"].raw_mm(torch.zeros(1, 128), data, int(Q.Q4_K))
