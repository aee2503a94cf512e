"""Profile decode steps of the running batch: where one step's time goes, by rows.

    DJANGO_SETTINGS_MODULE=project.settings_bench PYTHONPATH=. .venv/bin/python \
        bench/scripts/step_profile.py [--steps 32] [--rows 1,8] [--rounds 3] [--top 0] [--eager]

Prints, per batch size, the median (min-max) over rounds of: wall ms per step and its split into
the block kernels, the rest of the model's forward, choosing the tokens (argmax or the row's
processors), a row's accept (stop strings, detokenizing, the stream callback, here a no-op) and
the loop around them. The forward is the fused C++ step (chat/engine/local/llama_step.py) where
the model allows it: its own counters split it into the kernels, the other operators (in C++)
and the Python around the call. `--eager` profiles transformers' forward instead: the kernels
are the time inside BlockQuantLinear.forward, the rest torch's other operators and the Python
that calls them. `--top N` adds torch.profiler's top operators by self CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

import django


@contextmanager
def timing(owner, name: str, totals: dict, key: str):
    """Add the seconds spent in `owner.name` (a method) to totals[key] while inside."""
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - started

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--top", type=int, default=0)
    parser.add_argument("--eager", action="store_true", help="transformers' forward, not fused")
    args = parser.parse_args()
    django.setup()
    from torch.profiler import ProfilerActivity, profile

    from chat.engine.local.batching import Row
    from chat.engine.local.loader import load_backend
    from chat.engine.weights.blockquant import BlockQuantLinear
    from chat.infra.runtime import runtime

    backend = load_backend(runtime.engine_config(), progress=lambda line: None)
    model = backend.model
    print(
        f"dtype {model.dtype}, {backend.threads.describe()}, {'eager' if args.eager else 'fused'}"
    )

    def fill(rows: int):
        batch = backend.new_batch()
        batch.fused_step = not args.eager
        requests = [
            backend.request(
                [{"role": "user", "content": f"Tell me a long story, number {i}."}],
                max_new_tokens=10_000,
                min_new_tokens=10_000,
            )
            for i in range(rows)
        ]
        batch.add([backend.row(r, lambda text: None) for r in requests])
        for _ in range(4):
            batch.step()  # warm
        return batch

    def measure(rows: int) -> dict:
        batch = fill(rows)
        fused = batch._llama_step._step if batch._llama_step is not None else None
        if fused is not None:
            fused.profiling = True
            fused.profiled_steps = fused.profiled_ns = fused.profiled_matmul_ns = 0
        totals: dict = defaultdict(float)
        with (
            timing(BlockQuantLinear, "forward", totals, "kernels"),
            timing(batch, "_forward", totals, "forward"),
            timing(batch, "_choose", totals, "choose"),
            timing(Row, "accept", totals, "accept"),
        ):
            started = time.perf_counter()
            for _ in range(args.steps):
                batch.step()
            wall = time.perf_counter() - started
        n = args.steps
        split = {
            "kernels": totals["kernels"] / n,
            "other ops + Python": (totals["forward"] - totals["kernels"]) / n,
        }
        if fused is not None:
            fused.profiling = False
            in_cpp, kernels = fused.profiled_ns / 1e9, fused.profiled_matmul_ns / 1e9
            split = {
                "kernels": kernels / n,
                "other ops (in the C++ step)": (in_cpp - kernels) / n,
                "Python around the C++ step": (totals["forward"] - in_cpp) / n,
            }
        return {
            "step": wall / n,
            **split,
            "choose": (totals["choose"] - totals["accept"]) / n,
            "accept (stop, detokenize, stream)": totals["accept"] / n,
            "loop": (wall - totals["forward"] - totals["choose"]) / n,
        }

    for rows in [int(x) for x in args.rows.split(",")]:
        results = [measure(rows) for _ in range(args.rounds)]
        print(f"\n{rows} row(s), median (min-max) of {args.rounds} round(s) of {args.steps} steps")
        for key in results[0]:
            values = [r[key] * 1000 for r in results]
            print(
                f"  {key:36} {statistics.median(values):7.2f} ms "
                f"({min(values):.2f}-{max(values):.2f})"
            )
        step = statistics.median(r["step"] for r in results)
        print(f"  {rows / step:.1f} tok/s")
        if args.top:
            batch = fill(rows)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(args.steps // 4 or 1):
                    batch.step()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
