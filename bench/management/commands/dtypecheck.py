"""`manage.py dtypecheck`: fp32 against bf16 on this machine, speed and whether answers end where they should.

For each dtype: decode tok/s of one stream and of a batch of 8 (forced length, greedy), and
how many of 20 short prompts end on the model's end-of-turn token within 160 new tokens
(greedy, batched as the server batches). CHAT_ENGINE dtype=auto picks by the rule in
chat/engine/local/device.py `pick_dtype`; this command is how its figures were measured.

--quants none,int8,int4 repeats it per weight mode (CHAT_ENGINE quant=); with --simulate the
int8/int4 weights run in float matmuls (bench/quant_modes.py), so only the eos count means
anything for them and the speed columns are left out.
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand

import chat.engine  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads, as the server does)

PROMPTS = [
    "Say hello in five words.",
    "What is the capital of France?",
    "Count from 1 to 10, separated by commas.",
    "Name three colours.",
    "What is 2 plus 2?",
    "Give me a synonym for happy.",
    "What day comes after Monday?",
    "Translate 'thank you' into French.",
    "Write one sentence about the sea.",
    "What is the opposite of cold?",
    "Name a fruit that is yellow.",
    "How many legs does a spider have?",
    "What colour is the sky on a clear day?",
    "Suggest a name for a cat.",
    "What is water made of?",
    "Write a haiku about rain.",
    "Which planet is closest to the sun?",
    "Give one tip for sleeping well.",
    "What is the plural of mouse?",
    "Tell me a fun fact about owls.",
]


class Command(BaseCommand):
    help = "Compare fp32 and bf16 on this CPU: decode speed and how many short answers end on eos."

    def add_arguments(self, parser):
        parser.add_argument("--dtypes", default="float32,bfloat16")
        parser.add_argument(
            "--tokens", type=int, default=48, help="forced tokens for the speed runs"
        )
        parser.add_argument("--max-new-tokens", type=int, default=160)
        parser.add_argument("--quants", default="none", help="weight modes, e.g. none,int8,int4")
        parser.add_argument("--simulate", action="store_true")

    def handle(self, *args, **opts):
        from chat.engine.local.device import cpu_flags

        self.stdout.write(
            f"CPU flags that matter: {sorted(cpu_flags() & {'amx_bf16', 'avx512_bf16'})}"
        )
        from bench.quant_modes import load_mode

        for dtype in opts["dtypes"].split(","):
            for quant in opts["quants"].split(","):
                backend, label = load_mode(
                    quant,
                    simulate=opts["simulate"],
                    dtype=dtype,
                    progress=lambda line: self.stderr.write(line),
                )
                if opts["simulate"] and quant != "none":
                    speeds = "(speed: simulated, not measured)          "
                else:
                    one = self.speed(backend, 1, opts["tokens"])
                    eight = self.speed(backend, 8, opts["tokens"])
                    speeds = f"1 stream {one:5.1f} tok/s   8 streams {eight:5.1f} tok/s"
                ended = self.eos_count(backend, opts["max_new_tokens"])
                self.stdout.write(
                    f"{dtype:9} {label:16} {speeds}   ended on eos: {ended}/{len(PROMPTS)} "
                    f"(greedy, <= {opts['max_new_tokens']} tokens)"
                )

    @staticmethod
    def speed(backend, rows: int, tokens: int) -> float:
        requests = [
            backend.request(
                [{"role": "user", "content": f"Write a long story ({i})."}],
                max_new_tokens=tokens,
                min_new_tokens=tokens,
            )
            for i in range(rows)
        ]
        backend.generate(backend.request([{"role": "user", "content": "Hi"}], max_new_tokens=4))
        start = time.perf_counter()
        results = backend.generate_batch(requests, [lambda _t: None] * rows)
        return sum(r.new_tokens for r in results) / (time.perf_counter() - start)

    @staticmethod
    def eos_count(backend, max_new: int) -> int:
        ended = 0
        for start in range(0, len(PROMPTS), 8):
            chunk = PROMPTS[start : start + 8]
            requests = [
                backend.request([{"role": "user", "content": p}], max_new_tokens=max_new)
                for p in chunk
            ]
            results = backend.generate_batch(requests, [lambda _t: None] * len(chunk))
            ended += sum(r.finish_reason == "eos" for r in results)
        return ended
