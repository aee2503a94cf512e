"""Decode-step time under each thread plan, in process, alternating: prefill/decode threads.

    DJANGO_SETTINGS_MODULE=project.settings_bench PYTHONPATH=. .venv/bin/python \
        bench/scripts/thread_plan.py [--rows 1,4,8] [--rounds 3]

Plans: every thread for both, one thread for both, and the engine's default (every thread for
a prefill, one fewer for a decode step; chat/engine/local/threads.py). Prints the median step per
plan and row count (docs/engine.md, "How many threads").
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    django.setup()
    from chat.engine.local.loader import load_backend
    from chat.engine.local.threads import TORCH_DEFAULT, ThreadPlan
    from chat.infra.runtime import runtime

    backend = load_backend(runtime.engine_config(), progress=print)

    def step_ms(rows: int, warm: int = 40) -> float:
        batch = backend.new_batch()
        requests = [
            backend.request(
                [{"role": "user", "content": f"Tell me a long story about a dragon, number {i}."}],
                max_new_tokens=warm + args.steps + 5,
                min_new_tokens=warm + args.steps + 5,
            )
            for i in range(rows)
        ]
        batch.add([backend.row(request, lambda text: None) for request in requests])
        for _ in range(warm):
            batch.step()
        times = []
        for _ in range(args.steps):
            started = time.perf_counter()
            batch.step()
            times.append(time.perf_counter() - started)
        for request in requests:
            request.cancel.set()
        batch.drop_cancelled()
        return statistics.median(times) * 1000

    cores = TORCH_DEFAULT
    plans = {
        f"{cores}/{cores}": ThreadPlan(cores, cores),
        "1/1": ThreadPlan(1, 1),
        "default": ThreadPlan.configured(),
    }
    print(f"prefill/decode threads; default is {ThreadPlan.configured().describe()}")
    for rows in [int(r) for r in args.rows.split(",")]:
        seen: dict[str, list[float]] = {name: [] for name in plans}
        for _ in range(args.rounds):
            for name, plan in plans.items():
                backend.threads = plan
                seen[name].append(step_ms(rows))
        medians = ", ".join(f"{name} {statistics.median(v):.1f} ms" for name, v in seen.items())
        print(f"{rows} row(s): {medians}  (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
