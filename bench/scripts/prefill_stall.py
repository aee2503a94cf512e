"""What a long newcomer's prefill costs the rows already decoding: whole vs chunked, side by side.

    PYTHONPATH=. .venv/bin/python bench/scripts/prefill_stall.py [--words 700] [--chunks 0,64,128,256]

One row decodes; a newcomer with a long prompt joins. Per CHAT_PREFILL_CHUNK value: the running
row's longest gap between two tokens while the newcomer is prefilled, and the newcomer's time to
its first token.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings_bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=700)
    parser.add_argument("--chunks", default="0,64,128,256")
    args = parser.parse_args()
    import django

    django.setup()
    from chat.engine.local.loader import load_backend
    from chat.infra.runtime import runtime

    backend = load_backend(runtime.engine_config(), progress=lambda line: None)
    story = [{"role": "user", "content": "Write a long story about a dragon."}]
    long_prompt = [
        {"role": "user", "content": "Summarise: " + "the lighthouse keeper " * (args.words // 3)}
    ]
    tokens = len(backend.request(long_prompt).input_ids)
    print(f"newcomer's prompt: {tokens} tokens; 1-min load {os.getloadavg()[0]:.1f}")
    print(f"  {'chunk':>5} {'runner: longest gap':>20} {'newcomer: first token':>22}")
    for chunk in [int(c) for c in args.chunks.split(",")]:
        batch = backend.new_batch()
        batch.prefill_chunk = chunk
        runner = backend.row(
            backend.request(story, max_new_tokens=2000, min_new_tokens=2000), lambda text: None
        )
        batch.add([runner])
        for _ in range(3):
            batch.step()
        newcomer = backend.row(backend.request(long_prompt, max_new_tokens=2), lambda text: None)
        # Each step gives the runner one token: a step's duration is the gap between two of them
        # (the first one also holds a whole prefill when it is not chunked).
        gaps, first = [], None
        started = previous = time.perf_counter()
        batch.add([newcomer])
        while first is None:
            batch.step()
            now = time.perf_counter()
            gaps.append(now - previous)
            previous = now
            if newcomer.new_ids:
                first = now - started
        label = "whole" if chunk == 0 else str(chunk)
        print(f"  {label:>5} {max(gaps) * 1000:>17.0f} ms {first * 1000:>19.0f} ms")


if __name__ == "__main__":
    main()
