"""Static KV cache + torch.compile against the eager step, one stream, including compile time.

    PYTHONPATH=. .venv/bin/python bench/scripts/compile_trial.py [--tokens 64]

It is kept only if it wins here, start-up included (docs/engine.md). Prints, for eager
(DynamicCache) and for compiled (StaticCache, torch.compile of the forward): the first call's
seconds (what a server start would pay) and steady tok/s, greedy, forced length.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings_bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    import django

    django.setup()
    from dataclasses import replace

    import torch

    from chat.engine.local.loader import load_backend
    from chat.infra.runtime import runtime

    backend = load_backend(
        replace(runtime.engine_config(), weight_major="off"), progress=lambda line: None
    )
    model = backend.model
    ids = torch.tensor([backend.encode([{"role": "user", "content": "Tell me a long story."}])])
    n = args.tokens

    def run(**options) -> float:
        started = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=backend.tokenizer.eos_token_id,
                **options,
            )
        return time.perf_counter() - started

    print(f"{model.dtype}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
    first = run()
    steady = min(run() for _ in range(2))
    print(f"  eager, DynamicCache:   first call {first:6.1f} s, then {n / steady:5.1f} tok/s")
    model.forward = torch.compile(model.forward, dynamic=False)
    try:
        first = run(cache_implementation="static")
        steady = min(run(cache_implementation="static") for _ in range(2))
        print(f"  compiled, StaticCache: first call {first:6.1f} s, then {n / steady:5.1f} tok/s")
    except Exception as exc:  # report, do not hide: the trial's answer may be "does not run"
        print(f"  compiled, StaticCache: failed: {type(exc).__name__}: {str(exc)[:300]}")


if __name__ == "__main__":
    main()
