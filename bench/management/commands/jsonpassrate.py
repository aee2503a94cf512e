"""`manage.py jsonpassrate`: how often the json policy's answers validate, with and without help."""

import contextlib
import statistics
import time

from django.core.management.base import BaseCommand

from chat.management.engine_loading import load
from chat.policy import ExtractionError, extract_json, instance_errors

QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Name a primary color.",
    "What is 2 plus 2?",
    "Who wrote Hamlet?",
    "What is the boiling point of water in Celsius?",
    "Name a planet in our solar system.",
    "What language is spoken in Brazil?",
    "What is the largest ocean?",
    "How many days are in a week?",
    "What animal says moo?",
    "What is the opposite of hot?",
    "Name a fruit that is yellow.",
    "What is the chemical symbol for gold?",
    "How many continents are there?",
    "What do bees make?",
    "What is the tallest animal?",
    "What season comes after winter?",
    "What is the square root of 9?",
    "Name a musical instrument with strings.",
]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1}},
    "required": ["answer"],
}
SYSTEM = 'Reply only with JSON like {"answer": "..."}.'
EXAMPLE = [
    {"role": "user", "content": "What color is the sky?"},
    {"role": "assistant", "content": '{"answer": "blue"}'},
]


class Command(BaseCommand):
    help = "Pass rate of schema validation for the json policy's prompts: plain, few-shot, constrained."

    def add_arguments(self, parser):
        parser.add_argument("--prompts", type=int, default=20)
        parser.add_argument("--max-new-tokens", type=int, default=96)
        parser.add_argument("--temperature", type=float, default=0.0)
        parser.add_argument(
            "--quant", default="", help="none, int8 or int4 (default: as CHAT_ENGINE quant= loads)"
        )
        parser.add_argument("--simulate", action="store_true", help="int8/int4 in float matmuls")

    def handle(self, *args, prompts, max_new_tokens, temperature, quant, simulate, **options):
        if quant:
            from bench.quant_modes import load_mode

            backend, label = load_mode(
                quant, simulate=simulate, progress=lambda line: self.stderr.write(line)
            )
            self.stdout.write(f"weights: {label}")
        else:
            backend = load(self)
        ways = [
            ("instruction only", [], None),
            ("instruction + one example (json policy)", EXAMPLE, None),
            ("constrained decoding (xgrammar)", [], SCHEMA),
            ("constrained + example", EXAMPLE, SCHEMA),
        ]
        self.stdout.write(
            f"{prompts} prompts, greedy={temperature == 0}, max_new_tokens={max_new_tokens}\n"
        )
        self.stdout.write(f"{'way':42} {'valid':>7} {'median s':>9} {'tokens':>7}")
        for name, example, schema in ways:
            passed, seconds, tokens = 0, [], []
            for question in QUESTIONS[:prompts]:
                messages = [
                    {"role": "system", "content": SYSTEM},
                    *example,
                    {"role": "user", "content": question},
                ]
                request = backend.request(
                    messages,
                    max_new_tokens=max_new_tokens,
                    json_schema=schema,
                    temperature=temperature,
                )
                start = time.perf_counter()
                result = backend.generate(request)
                seconds.append(time.perf_counter() - start)
                tokens.append(result.new_tokens)
                with contextlib.suppress(ExtractionError):
                    passed += not instance_errors(extract_json(result.text), SCHEMA)
            self.stdout.write(
                f"{name:42} {passed:>3}/{prompts:<3} {statistics.median(seconds):>9.2f} {statistics.median(tokens):>7.0f}"
            )
