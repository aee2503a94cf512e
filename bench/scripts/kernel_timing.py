"""The block-quant kernels alone, on the bundled model's matmul shapes: this tree's against another
revision's (or this tree's AVX2 build), alternating calls, median microseconds.

Each shape is timed over enough copies of its weights (80 MB) that they come from memory, not
cache, as in a decode step, which reads the whole model once.

    PYTHONPATH=. .venv/bin/python bench/scripts/kernel_timing.py [--against main] [--rows 1,4,8]

`--against REV` compiles REV's chat/engine/weights/kernels/blockquant.cpp (AVX2 flags, as it was built)
under a name of its own in CHAT_KERNEL_CACHE; `--against avx2` times this tree's AVX2 build.
A step's total is the per-layer shapes times 30 layers plus the LM head once.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import torch

from chat.engine.weights import blockquant

# (kind, out_features, in_features, calls a step): q/o, k/v, gate/up, down, the LM head.
SHAPES = [
    ("q4_1", 576, 576, 60),
    ("q4_1", 192, 576, 60),
    ("q4_1", 1536, 576, 60),
    ("q4_1", 576, 1536, 30),
    ("q8_0", 49152, 576, 1),
]


def other_build(against: str):
    if against == "avx2":
        return blockquant.build("avx2")
    from torch.utils import cpp_extension

    source = subprocess.run(
        ["git", "show", f"{against}:chat/engine/weights/kernels/blockquant.cpp"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    name = f"chat_blockquant_{against.replace('/', '_').replace('-', '_')}"
    directory = blockquant.build_directory("against") / name
    directory.mkdir(parents=True, exist_ok=True)
    path = Path(directory) / "blockquant.cpp"
    if not path.exists() or path.read_text() != source:
        path.write_text(source)
    return cpp_extension.load(
        name,
        [str(path)],
        extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c"],
        build_directory=str(directory),
    )


def call(module, layer, x, int8: bool):
    if hasattr(module, "isa"):  # one entry point per format, with the activation flag
        if layer.kind == "q4_1":
            return lambda: module.q4_1_mm(x, layer.qs, layer.d, layer.m, int8)
        return lambda: module.q8_0_mm(x, layer.qs, layer.d, int8)
    suffix = "_q8" if int8 else ""
    if layer.kind == "q4_1":
        fn = getattr(module, f"q4_1_mm{suffix}")
        return lambda: fn(x, layer.qs, layer.d, layer.m)
    fn = getattr(module, f"q8_0_mm{suffix}")
    return lambda: fn(x, layer.qs, layer.d)


def every(fns):
    fns = list(fns)

    def run():
        for fn in fns:
            out = fn()
        return out

    return run


def layer_of(kind: str, out_features: int, in_features: int):
    g = torch.Generator().manual_seed(0)
    d = torch.rand(out_features, in_features // 32, generator=g) * 0.02
    if kind == "q4_1":
        q = torch.randint(0, 16, (out_features, in_features), generator=g)
        return blockquant.BlockQuantLinear.q4_1(q, d, -torch.rand(d.shape, generator=g) * 0.1)
    q = torch.randint(-127, 128, (out_features, in_features), generator=g)
    return blockquant.BlockQuantLinear.q8_0(q, d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="main")
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--int8", action="store_true", help="int8 activations (gguf-q8)")
    args = parser.parse_args()
    new = blockquant.kernels()
    old = other_build(args.against)
    print(f"threads {torch.get_num_threads()}, this tree: {new.isa()}, against: {args.against}")
    for rows in [int(r) for r in args.rows.split(",")]:
        totals = {"old": 0.0, "new": 0.0}
        for kind, n, k, per_step in SHAPES:
            copies = max(1, int(80e6 // (n * k * (0.75 if kind == "q4_1" else 1.125))))
            layers = [layer_of(kind, n, k) for _ in range(copies)]
            x = torch.randn(rows, k)
            fns = {
                which: every(call(module, layer, x, args.int8) for layer in layers)
                for which, module in (("old", old), ("new", new))
            }
            torch.testing.assert_close(fns["new"](), fns["old"](), rtol=2e-2, atol=2e-2)
            repeat = max(1, 20000 // n // copies)
            times: dict[str, list[float]] = {"old": [], "new": []}
            for _ in range(args.rounds):
                for which, fn in fns.items():
                    started = time.perf_counter()
                    for _ in range(repeat):
                        fn()
                    elapsed = time.perf_counter() - started
                    times[which].append(elapsed / repeat / copies * 1e6)
            med = {which: statistics.median(t) for which, t in times.items()}
            for which in totals:
                totals[which] += med[which] * per_step / 1000
            print(
                f"rows {rows} {kind} {n:>5}x{k:<5} old {med['old']:8.1f} us  "
                f"new {med['new']:8.1f} us  {med['old'] / med['new']:.2f}x"
            )
        print(
            f"rows {rows}: a step's kernels old {totals['old']:.1f} ms, new {totals['new']:.1f} ms"
        )


if __name__ == "__main__":
    main()
