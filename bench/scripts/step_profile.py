"""Profile decode steps of the running batch: where one step's time goes, at 1 and 4 rows.

    DJANGO_SETTINGS_MODULE=project.settings_bench PYTHONPATH=. .venv/bin/python \
        bench/scripts/step_profile.py [--steps 32] [--rows 1,4]

Prints, per batch size: wall ms per step, the model forward's share, what is left for the
loop around it (mask, positions, picking, streaming), and the top operators by self CPU time
from torch.profiler.
"""

from __future__ import annotations

import argparse
import time

import django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rows", default="1,4")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    django.setup()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from chat.engine.local.loader import load_backend
    from chat.infra.runtime import runtime

    backend = load_backend(runtime.engine_config(), progress=lambda line: None)
    print(f"dtype {backend.model.dtype}, {torch.get_num_threads()} threads")

    def fill(rows: int):
        batch = backend.new_batch()
        requests = [
            backend.request(
                [{"role": "user", "content": f"Tell me a long story, number {i}."}],
                max_new_tokens=10_000,
                min_new_tokens=10_000,
            )
            for i in range(rows)
        ]
        batch.add([backend.row(r, lambda text: None) for r in requests])
        return batch

    for rows in [int(x) for x in args.rows.split(",")]:
        batch = fill(rows)
        for _ in range(4):
            batch.step()  # warm
        forward_s = 0.0
        original = batch._forward

        def timed_forward(*a, _original=original, **k):
            nonlocal forward_s
            started = time.perf_counter()
            out = _original(*a, **k)
            forward_s += time.perf_counter() - started
            return out

        batch._forward = timed_forward
        started = time.perf_counter()
        for _ in range(args.steps):
            batch.step()
        wall = (time.perf_counter() - started) / args.steps
        forward = forward_s / args.steps
        print(
            f"\n{rows} row(s): {wall * 1000:.1f} ms per step ({rows / wall:.1f} tok/s), "
            f"model forward {forward * 1000:.1f} ms ({forward / wall:.0%}), "
            f"around it {(wall - forward) * 1000:.1f} ms"
        )
        batch._forward = original
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps // 4 or 1):
                batch.step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
