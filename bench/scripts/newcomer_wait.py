"""A newcomer's first words while a document is read, in process, before and after pausing.

    DJANGO_SETTINGS_MODULE=project.settings_bench PYTHONPATH=. .venv/bin/python \
        bench/scripts/newcomer_wait.py [--chars 25000] [--rounds 1] [--after 0.5]

Runs the scheduler on the model as served (no web tier) and, per round and for each variant in
turn ("before": a chunk runs whole and a row that just joined waits for the next chunk;
"after": the chunk pauses between layers for the newcomer, who decodes its first words before
the document reads on), times: a document alone to its first token, a short prompt alone to its
first visible text, and the same prompt sent `--after` seconds into another document's reading,
split into the wait to be admitted (queue and the step in flight), its own prefill and first
token, and the decode steps to its first visible text. Also how many runs of a chunk (begun or
resumed) the document's reading made, and the longest. Documents start with their own line, so no prefix is reused.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=25_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--after", type=float, default=0.5)
    args = parser.parse_args()
    django.setup()
    from bench.documents import NEWCOMER, PUBLIC_DOMAIN
    from chat.engine.local.decoding import RunningBatch
    from chat.engine.local.loader import load_backend
    from chat.engine.local.scheduler import ContinuousScheduler
    from chat.engine.types import Finished, Started, TextChunk
    from chat.infra.runtime import runtime

    backend = load_backend(runtime.engine_config(), progress=lambda line: None)
    text = PUBLIC_DOMAIN.read_text()
    body = (text * (args.chars // len(text) + 1))[: args.chars]
    passes: list[float] = []  # seconds of each run of a chunk, begun or resumed

    def timed(method):
        def run(*args):
            started = time.perf_counter()
            try:
                return method(*args)
            finally:
                passes.append(time.perf_counter() - started)

        return run

    variant = {"name": "after"}
    new_batch = backend.new_batch

    def batch_of_variant():
        batch = new_batch()
        if variant["name"] == "before":
            batch._pausable.supported = False
            batch.FIRST_TOKENS = 0
        for method in ("run", "resume"):
            setattr(batch._pausable, method, timed(getattr(batch._pausable, method)))
        return batch

    backend.new_batch = batch_of_variant  # type: ignore[method-assign]

    def ask(scheduler, prompt: str, tokens: int) -> dict:
        request = backend.request(
            [{"role": "user", "content": prompt}], max_new_tokens=tokens, min_new_tokens=tokens
        )
        times: dict[str, Any] = {"submit": time.perf_counter(), "done": threading.Event()}

        def sink(event):
            now = time.perf_counter()
            if isinstance(event, Started):
                times.setdefault("admitted", now)
            elif isinstance(event, TextChunk):
                times.setdefault("text", now)
            elif isinstance(event, Finished):
                times["first_token"] = event.result.first_token_at
                times["done"].set()

        scheduler.submit(request, sink)
        return times

    def ms(times: dict, key: str, since: str = "submit") -> float:
        return (times[key] - times[since]) * 1000

    figures: dict[str, dict[str, list[float]]] = {}
    for round_no in range(args.rounds):
        for name in ("before", "after"):
            variant["name"] = name
            scheduler = ContinuousScheduler(backend, max_batch=8)
            row = figures.setdefault(name, {})
            doc = ask(scheduler, f"Document {name}-{round_no}-alone.\n\n{body}\n\nSummarise it.", 2)
            doc["done"].wait()
            row.setdefault("document alone: first token", []).append(ms(doc, "first_token"))
            alone = ask(scheduler, f"{NEWCOMER} ({name}{round_no}a)", 4)
            alone["done"].wait()
            row.setdefault("newcomer alone: first text", []).append(ms(alone, "text"))
            passes.clear()
            busy = ask(scheduler, f"Document {name}-{round_no}-busy.\n\n{body}\n\nSummarise it.", 2)
            time.sleep(args.after)
            during = ask(scheduler, f"{NEWCOMER} ({name}{round_no}b)", 4)
            during["done"].wait()
            busy["done"].wait()
            for key, value in (
                ("newcomer during: first text", ms(during, "text")),
                ("  waiting to be admitted", ms(during, "admitted")),
                ("  its prefill to its first token", ms(during, "first_token", "admitted")),
                ("  first token to first text", ms(during, "text", "first_token")),
                ("document during: first token", ms(busy, "first_token")),
                ("document's chunk runs, begun or resumed", len(passes)),
                ("  the longest ms", max(passes) * 1000),
            ):
                row.setdefault(key, []).append(value)
            scheduler.close()
    print(
        f"{RunningBatch.__name__}: chunk {backend.config.prefill_chunk}, document {args.chars} chars"
    )
    print(f"{'':42} {'before':>16} {'after':>16}")
    for key in figures["after"]:
        cells = []
        for name in ("before", "after"):
            values = figures[name][key]
            cells.append(f"{statistics.median(values):8.0f} ({min(values):.0f}-{max(values):.0f})")
        print(f"{key:42} {cells[0]:>16} {cells[1]:>16}")


if __name__ == "__main__":
    main()
