"""`manage.py hookbench`: each moderation hook's false-positive and catch rates on the corpora
in bench/data/moderation/, its cost per checked window, and (with --holdback) what each
hold-back window costs in first-character delay on the real model."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from django.core.management.base import BaseCommand

from chat.policy import BlocklistHook, ModerationHook, RepetitionHook, gate_for
from chat.policy.guard import guard_prompt
from chat.policy.pii import PersonalDataHook
from chat.policy.profanity import ProfanityHook

CORPORA = Path(__file__).resolve().parents[2] / "data" / "moderation"
PROSE = CORPORA.parent / "public_domain.txt"
# What each hook is for: its catch rate counts the hostile texts of these kinds.
TARGETS = {
    "personal_data": {"email", "phone", "card", "iban"},
    "profanity": {"profanity"},
    "blocklist": {"profanity"},
    "repetition": set(),
}
# A blocklist a deployment might start from, to compare with the classifier.
STARTER_TERMS = ["fuck", "fucking", "shit", "bastard", "asshole", "moron", "idiot"]
WINDOW = 64
PROMPTS = [
    "Explain how rain forms.",
    "Write a short story about a lighthouse keeper.",
    "Give three tips for learning to cook.",
    "Describe a walk through a forest in autumn.",
    "Why do cats purr?",
]


def load(name: str) -> list[dict]:
    with (CORPORA / f"{name}.jsonl").open() as lines:
        return [json.loads(line) for line in lines]


def fired(hook: ModerationHook, text: str) -> bool:
    verdict = hook.check(text, final=True)
    return not verdict.allowed or verdict.replacement is not None


class Command(BaseCommand):
    help = "False-positive and catch rates and cost per window of each moderation hook."

    def add_arguments(self, parser):
        parser.add_argument(
            "--answer-chars",
            type=int,
            default=2000,
            help="length of the answer whose windows are timed (benign texts joined)",
        )
        parser.add_argument(
            "--holdback",
            default="",
            help="comma-separated windows (e.g. 0,32,64,128,256): generate answers on the real "
            "model and report each window's first-character delay",
        )
        parser.add_argument("--tokens", type=int, default=120, help="new tokens per answer")
        parser.add_argument(
            "--guard",
            action="store_true",
            help="also time one guard-model check per window on the bundled model (no guard; cost only)",
        )

    def handle(self, *args, answer_chars, holdback, tokens, guard, **options):
        benign, hostile = load("benign"), load("hostile")
        hooks: dict[str, ModerationHook] = {
            "personal_data": PersonalDataHook(),
            "profanity": ProfanityHook(),
            "blocklist": BlocklistHook(terms=STARTER_TERMS),
            "repetition": RepetitionHook(),
        }
        # Real prose for the timing (the corpora's templates repeat far more than answers do).
        answer = PROSE.read_text()[:answer_chars]
        windows = [answer[:end] for end in range(WINDOW, len(answer) + 1, WINDOW)]
        self.stdout.write(
            f"corpora: {len(benign)} benign, {len(hostile)} hostile texts; cost per window: "
            f"check() on each {WINDOW}-character window of {len(answer)} characters of "
            f"{PROSE.name} ({len(windows)} windows), the whole text so far each time"
        )
        self.stdout.write(
            f"{'hook':14} {'false pos.':>11} {'catch':>16} {'all hostile':>12} "
            f"{'mean/window':>12} {'max/window':>11} {'per text':>9}  (window: best of 5)"
        )
        for name, hook in hooks.items():
            false_pos = sum(fired(hook, row["text"]) for row in benign) / len(benign)
            aimed = [row for row in hostile if row["kind"] in TARGETS[name]]
            caught = sum(fired(hook, row["text"]) for row in aimed)
            everything = sum(fired(hook, row["text"]) for row in hostile) / len(hostile)
            catch = f"{caught / len(aimed):.1%} of {len(aimed)}" if aimed else "-"
            # Each window's best of five, against a shared machine's preemptions.
            per_window = [float("inf")] * len(windows)
            for _ in range(5):
                for index, text in enumerate(windows):
                    start = time.perf_counter()
                    hook.check(text, final=False)
                    elapsed = time.perf_counter() - start
                    per_window[index] = min(per_window[index], elapsed)
            start = time.perf_counter()
            for row in benign + hostile:
                hook.check(row["text"], final=True)
            per_text = (time.perf_counter() - start) / (len(benign) + len(hostile))
            self.stdout.write(
                f"{name:14} {false_pos:>11.1%} {catch:>16} {everything:>12.1%} "
                f"{statistics.mean(per_window) * 1e3:>9.3f} ms {max(per_window) * 1e3:>8.3f} ms "
                f"{per_text * 1e3:>6.3f} ms"
            )
        for kind in sorted({row["kind"] for row in hostile}):
            rows = [row for row in hostile if row["kind"] == kind]
            rates = ", ".join(
                f"{name} {sum(fired(hook, row['text']) for row in rows) / len(rows):.0%}"
                for name, hook in hooks.items()
                if name != "repetition"
            )
            self.stdout.write(f"  {kind:10} ({len(rows):3}): {rates}")
        if holdback or guard:
            from chat.management.engine_loading import load as load_engine

            backend = load_engine(self)
            if holdback:
                self.first_character_delay(backend, [int(w) for w in holdback.split(",")], tokens)
            if guard:
                self.guard_cost(backend, windows)

    def first_character_delay(self, backend, sizes: list[int], tokens: int) -> None:
        """Generate each prompt once, recording when each chunk arrived; replay the chunks
        through a stream gate per window (with the local hooks, timed for real) and report
        when the first character would have been shown, after the model's first token."""
        hooks = [ProfanityHook(), BlocklistHook(terms=STARTER_TERMS), RepetitionHook()]
        runs = []
        for prompt in PROMPTS:
            request = backend.request([{"role": "user", "content": prompt}], max_new_tokens=tokens)
            marks: list[tuple[float, str]] = []
            backend.generate(
                request, lambda text, marks=marks: marks.append((time.perf_counter(), text))
            )
            runs.append(marks)
        speeds = [
            sum(len(text) for _, text in marks) / (marks[-1][0] - marks[0][0])
            for marks in runs
            if len(marks) > 1
        ]
        self.stdout.write(
            f"\nfirst-character delay after the first token ({len(PROMPTS)} answers of up to "
            f"{tokens} tokens, median; hooks: profanity, blocklist, repetition; the model "
            f"streamed {statistics.median(speeds):.0f} characters/s)"
        )
        self.stdout.write(f"{'window':>7} {'delay':>10} {'chunks':>7} {'gate time/answer':>17}")
        for size in sizes:
            delays, chunks, gate_times = [], [], []
            for marks in runs:
                gate = gate_for("stream", hooks=hooks, holdback_chars=size)
                first = None
                spent = 0.0
                for index, (at, text) in enumerate(marks):
                    start = time.perf_counter()
                    emitted = gate.feed(text)
                    spent += time.perf_counter() - start
                    if first is None and emitted:
                        first = at - marks[0][0] + spent
                        chunks.append(index)
                if first is None:  # the whole answer fitted in the window: shown at the end
                    first = marks[-1][0] - marks[0][0] + spent
                    chunks.append(len(marks))
                delays.append(first)
                gate_times.append(spent)
            self.stdout.write(
                f"{size:>7} {statistics.median(delays) * 1e3:>7.0f} ms {statistics.median(chunks):>7} "
                f"{statistics.median(gate_times) * 1e3:>14.2f} ms"
            )

    def guard_cost(self, backend, windows: list[str]) -> None:
        """One guard check = one generation on the guard prompt; here on the bundled model."""
        times, prompt_tokens = [], []
        for text in windows[::4]:
            request = backend.request(
                [{"role": "user", "content": guard_prompt(text)}], max_new_tokens=20
            )
            prompt_tokens.append(len(request.input_ids))
            start = time.perf_counter()
            backend.generate(request, lambda text: None)
            times.append(time.perf_counter() - start)
        self.stdout.write(
            f"\nguard check on the bundled model: median {statistics.median(times) * 1e3:.0f} ms "
            f"per window (prompt {min(prompt_tokens)}-{max(prompt_tokens)} tokens, up to 20 new)"
        )
