"""Each GGUF block type's matmul kernel on one weight shape, one thread, beside fp32's matmul.

    PYTHONPATH=. .venv/bin/python bench/scripts/block_kernel_timing.py [--shape 6144x768]
        [--rows 1,4,8] [--isa avx2] [--repeats 200] [--threads 1] [--dequantized]

Prints the best time of --repeats calls per block type and row count (the weights are random
but valid blocks); a type widened at load (Q5_0, Q4_K, Q6_K) also through its own kernel on the
rows as stored. To compare two checkouts, run it from each in the same command: each checkout
builds its own kernels. `--dequantized` adds, per type, the other way to compute the same rows:
the weight dequantized to fp32 and torch's GEMM (what BlockQuantLinear does above
MAX_KERNEL_ROWS), so the row count where the GEMM starts to win can be read off, e.g.
`--rows 16,32,64,96,128,256 --threads 2 --dequantized --shape 1536x576`.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import gguf
import numpy as np
import torch

from harness.gguf_rows import blocks

Q = gguf.GGMLQuantizationType
TYPES = [Q.Q4_1, Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K]


def file_rows(qtype: gguf.GGMLQuantizationType, rows: int, columns: int) -> np.ndarray:
    return blocks(qtype, rows, columns, np.random.default_rng(int(qtype)))


def best(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="6144x768", help="out x in features")
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--isa", default="", help="avx2: the AVX2 build on an AVX-512 CPU")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="torch's (and the kernels') threads")
    parser.add_argument("--dequantized", action="store_true", help="also dequantize + fp32 GEMM")
    args = parser.parse_args()
    from chat.engine.weights import blockquant

    torch.set_num_threads(args.threads)
    out_features, in_features = (int(n) for n in args.shape.split("x"))
    module = blockquant.build(blockquant.isa_level(wanted=args.isa))
    rows = [int(r) for r in args.rows.split(",")]
    print(
        f"{module.isa()} kernels, {out_features}x{in_features}, {args.threads} thread(s), best of "
        f"{args.repeats}; 1-min load {os.getloadavg()[0]:.1f}"
    )
    print(f"  {'type':>6} " + " ".join(f"{f'{r} row(s)':>11}" for r in rows))
    weight = torch.randn(out_features, in_features)
    line = [best(float_call(weight, r), args.repeats) for r in rows]
    print(f"  {'fp32':>6} " + " ".join(f"{t * 1000:>8.3f} ms" for t in line))
    for qtype in TYPES:
        if in_features % gguf.GGML_QUANT_SIZES[qtype][0]:
            continue  # a k-quant's 256-weight super-block does not fit these rows
        data = torch.from_numpy(file_rows(qtype, out_features, in_features))
        layer = blockquant.BlockQuantLinear.from_gguf(int(qtype), data, in_features)
        line = [best(kernel_call(module, layer, r, False), args.repeats) for r in rows]
        print(f"  {qtype.name:>6} " + " ".join(f"{t * 1000:>8.3f} ms" for t in line))
        if qtype.name.lower() in blockquant.WIDENED_AS:  # beside the type's own kernel
            line = [best(stored_call(module, data, int(qtype), r), args.repeats) for r in rows]
            print(f"  {'stored':>6} " + " ".join(f"{t * 1000:>8.3f} ms" for t in line))
        if layer.kind in blockquant.SPLIT_KINDS:  # llama.cpp's way: int8 activations, VNNI
            line = [best(kernel_call(module, layer, r, True), args.repeats) for r in rows]
            print(f"  {'int8x':>6} " + " ".join(f"{t * 1000:>8.3f} ms" for t in line))
        if args.dequantized:
            line = [best(dequantized_call(layer, r), args.repeats) for r in rows]
            print(f"  {'deq+mm':>6} " + " ".join(f"{t * 1000:>8.3f} ms" for t in line))


def float_call(weight: torch.Tensor, rows: int) -> Callable[[], object]:
    x = torch.randn(rows, weight.shape[1])
    return lambda: torch.nn.functional.linear(x, weight)


def dequantized_call(layer, rows: int) -> Callable[[], object]:
    x = torch.randn(rows, layer.in_features)
    return lambda: torch.nn.functional.linear(x, layer.weight_float())


def stored_call(module, data: torch.Tensor, ggml_type: int, rows: int) -> Callable[[], object]:
    """The type's own kernel on the file's rows as stored (a widened type's other way)."""
    x = torch.randn(
        rows,
        data.shape[1] // gguf.GGML_QUANT_SIZES[ggml_type][1] * gguf.GGML_QUANT_SIZES[ggml_type][0],
    )
    return lambda: module.raw_mm(x, data, ggml_type)


def kernel_call(module, layer, rows: int, int8: bool) -> Callable[[], object]:
    """One build's kernel for the layer's kind on `rows` random activation rows."""
    x = torch.randn(rows, layer.in_features)
    if layer.kind == "q4_1":
        return lambda: module.q4_1_mm(x, layer.qs, layer.d, layer.m, int8)
    if layer.kind == "q8_0":
        return lambda: module.q8_0_mm(x, layer.qs, layer.d, int8)
    return lambda: module.raw_mm(x, layer.qs, layer.ggml_type)


if __name__ == "__main__":
    main()
