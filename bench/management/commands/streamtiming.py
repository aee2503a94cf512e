"""`manage.py streamtiming`: the seed's exercise, time to first and last character, streamed vs not."""

import statistics
import threading
import time

import torch
from django.core.management.base import BaseCommand
from transformers import TextIteratorStreamer

from chat.management.engine_loading import load

PROMPT = "Write a detailed story about a lighthouse keeper who finds a message in a bottle."


class Command(BaseCommand):
    help = "Stream a long answer and time first and last visible character; then the same without streaming."

    def add_arguments(self, parser):
        parser.add_argument(
            "--tokens", type=int, default=300, help="new tokens per answer (eos is ignored)"
        )
        parser.add_argument(
            "--runs", type=int, default=1, help="repeat each way and report medians"
        )
        parser.add_argument("--prompt", default=PROMPT)

    def handle(self, *args, tokens, runs, prompt, **options):
        backend = load(self)
        request = backend.request([{"role": "user", "content": prompt}], max_new_tokens=tokens)
        input_ids = torch.tensor([request.input_ids])
        # eos_token_id=[] would not stop at eos; min_new_tokens makes every way produce `tokens` tokens.
        fixed = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False}

        def plain():
            start = time.perf_counter()
            with torch.inference_mode():
                backend.model.generate(
                    input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **fixed
                )
            end = time.perf_counter()
            return None, end - start

        def seed_streamer():
            # The seed's shape: generate on a thread, TextIteratorStreamer yields chunks here.
            streamer = TextIteratorStreamer(
                backend.tokenizer, skip_prompt=True, skip_special_tokens=True
            )
            kwargs = dict(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                streamer=streamer,
                **fixed,
            )
            start = time.perf_counter()
            thread = threading.Thread(target=lambda: backend.model.generate(**kwargs))
            thread.start()
            first = None
            for chunk in streamer:
                if chunk and first is None:
                    first = time.perf_counter() - start
            thread.join()
            return first, time.perf_counter() - start

        def engine_streamed():
            # What the server runs: the engine's per-row streamer and stopping rules.
            marks = []
            fixed_request = backend.request(
                [{"role": "user", "content": prompt}], max_new_tokens=tokens, min_new_tokens=tokens
            )
            start = time.perf_counter()
            result = backend.generate(fixed_request, lambda text: marks.append(time.perf_counter()))
            return (marks[0] - start if marks else None), result.finished_at - start

        ways = [
            ("model.generate, not streamed", plain),
            ("engine streamer (server path)", engine_streamed),
            ("TextIteratorStreamer + thread (seed)", seed_streamer),
        ]
        plain()  # warm-up: first call pays one-off allocation costs
        results = {name: [way() for _ in range(runs)] for name, way in ways}

        floor = statistics.median(total for _, total in results[ways[0][0]])
        self.stdout.write(
            f"{tokens} new tokens, prompt of {len(request.input_ids)} tokens, {torch.get_num_threads()} torch threads, median of {runs}\n"
        )
        self.stdout.write(
            f"{'way':40} {'first char':>11} {'last char':>10} {'tok/s':>7} {'vs plain':>9}"
        )
        for name, _ in ways:
            firsts = [f for f, _ in results[name] if f is not None]
            total = statistics.median(t for _, t in results[name])
            first = f"{statistics.median(firsts):.3f} s" if firsts else "-"
            self.stdout.write(
                f"{name:40} {first:>11} {total:>8.3f} s {tokens / total:>7.1f} {total / floor:>8.2f}x"
            )
        self.stdout.write("")
        self.stdout.write(self.cancel_latency(backend, request))

    def cancel_latency(self, backend, request) -> str:
        """How long the model runs on after the cancel flag is set, in time and tokens."""
        from dataclasses import replace

        request = replace(
            request,
            params=request.params.with_changes(max_new_tokens=200),
            cancel=threading.Event(),
        )
        flagged = {}

        def on_text(text):
            if "at" not in flagged:
                flagged["at"] = time.perf_counter()
                request.cancel.set()

        result = backend.generate(request, on_text)
        stopped = result.finished_at - flagged["at"]
        return (
            f"cancel: generate returned {stopped * 1000:.1f} ms after the flag was set; "
            f"{result.new_tokens} tokens in all (flag set as the first chunk arrived), finish_reason={result.finish_reason}"
        )
