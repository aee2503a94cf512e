"""`manage.py answerquality`: how everyday answers end under a policy, the yardstick for decoding.

Runs the fixed prompt set (bench/prompts/everyday.json) through a stored output policy the way
a chat turn does: the policy's system prompt, examples, limits, penalties and moderation
hooks, batched 8 at a time as the server batches, each answer fed to the policy's gate as
it streams. Reports how answers end (eos, stop_string, length, cut at a loop with the good
part kept, withdrawn whole), the share of repeated word 4-grams, and tokens per answer.

    manage.py answerquality                       # the default policy as stored
    manage.py answerquality --repetition-penalty 1.1 --max-new-tokens 512   # a trial

Figures are for the CPU and dtype at hand: batched greedy wording differs between them.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from django.core.management.base import BaseCommand

import chat.engine  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads, as the server does)
from chat.management.engine_loading import load
from chat.policy import Cut, Retract, gate_for
from chat.stores import policy_store
from chat.turns.prompting import fit_prompt, request_for
from harness.quality import repeated_ngram_rate

PROMPTS = Path(__file__).resolve().parents[2] / "prompts" / "everyday.json"
ENDINGS = ("eos", "stop_string", "length", "cut", "withdrawn", "invalid")


class Command(BaseCommand):
    help = "Run the everyday prompt set through a policy; report how answers end."

    def add_arguments(self, parser):
        parser.add_argument("--policy", help="policy slug (default: the default policy)")
        parser.add_argument("--prompts", default=str(PROMPTS), help="a prompt set file")
        parser.add_argument("--limit", type=int, default=0, help="only the first N prompts")
        parser.add_argument("--batch", type=int, default=8, help="rows decoded together")
        parser.add_argument("--max-new-tokens", type=int)
        parser.add_argument("--repetition-penalty", type=float)
        parser.add_argument("--no-repeat-ngram-size", type=int)
        parser.add_argument("--frequency-penalty", type=float)
        parser.add_argument("--presence-penalty", type=float)
        parser.add_argument("--system-prompt", help="in place of the policy's")
        parser.add_argument("--json", help="also write every answer and the summary here")

    def handle(self, *args, **opts):
        policy = policy_store.policy_for(opts["policy"])
        trial = {
            name: opts[name]
            for name in (
                "max_new_tokens",
                "repetition_penalty",
                "no_repeat_ngram_size",
                "frequency_penalty",
                "presence_penalty",
            )
            if opts[name] is not None
        }
        policy = replace(policy, sampling=policy.sampling.with_changes(**trial))
        if opts["system_prompt"] is not None:
            policy = replace(policy, system_prompt=opts["system_prompt"])
        prompts = json.loads(Path(opts["prompts"]).read_text())["prompts"]
        if opts["limit"]:
            prompts = prompts[: opts["limit"]]
        backend = load(self)
        started = time.perf_counter()
        answers = []
        for start in range(0, len(prompts), opts["batch"]):
            answers += self.run_batch(backend, policy, prompts[start : start + opts["batch"]])
            self.stderr.write(f"  {len(answers)}/{len(prompts)} answers")
        summary = self.summary(policy, answers, time.perf_counter() - started)
        for line in summary["lines"]:
            self.stdout.write(line)
        if opts["json"]:
            Path(opts["json"]).write_text(
                json.dumps({"summary": summary, "answers": answers}, indent=1)
            )

    @staticmethod
    def run_batch(backend, policy, prompts: list[dict]) -> list[dict]:
        """One batch through the engine, each row's text fed to its own gate as it streams."""
        requests: list = []
        gates: list = []
        verdicts: list = []
        for index, prompt in enumerate(prompts):
            messages, _rendered, input_ids = fit_prompt(backend, policy, [], prompt["text"])
            request = request_for(backend, policy, input_ids, f"quality-{index}", messages)
            requests.append(request)
            gates.append(gate_for(policy.mode, hooks=policy.hooks, schema=policy.schema))
            verdicts.append([])

        def feeder(index: int):
            def on_text(text: str) -> None:
                for action in gates[index].feed(text):
                    if isinstance(action, (Cut, Retract)):
                        verdicts[index].append(action)
                        requests[index].cancel.set()  # as the turn does: stop generating

            return on_text

        results = backend.generate_batch(requests, [feeder(i) for i in range(len(prompts))])
        answers = []
        for prompt, gate, result in zip(prompts, gates, results, strict=True):
            _actions, outcome = gate.finish()
            if outcome.status == "moderated":
                ending = "withdrawn"
            elif outcome.status == "invalid":
                ending = "invalid"
            elif gate.cut:
                ending = "cut"
            else:
                ending = result.finish_reason
            answers.append(
                {
                    "kind": prompt["kind"],
                    "prompt": prompt["text"],
                    "ending": ending,
                    "reason": gate.cut or outcome.reason,
                    "new_tokens": result.new_tokens,
                    "repeated_4gram": round(repeated_ngram_rate(gate.raw), 3),
                    "text": gate.shown + outcome.held_text if outcome.status == "ok" else "",
                    "raw": gate.raw,
                }
            )
        return answers

    @staticmethod
    def summary(policy, answers: list[dict], seconds: float) -> dict:
        counts = Counter(a["ending"] for a in answers)
        total = len(answers)
        tokens = [a["new_tokens"] for a in answers]
        params = policy.sampling
        settings = {
            "policy": f"{policy.slug} v{policy.version}",
            **{
                name: getattr(params, name)
                for name in (
                    "max_new_tokens",
                    "repetition_penalty",
                    "no_repeat_ngram_size",
                    "frequency_penalty",
                    "presence_penalty",
                    "temperature",
                )
            },
        }
        ended_well = counts["eos"] + counts["stop_string"] + counts["cut"]
        figures = {
            "answers": total,
            **{ending: counts[ending] for ending in ENDINGS},
            "ended_well_pct": round(100 * ended_well / total, 1),
            "length_pct": round(100 * counts["length"] / total, 1),
            "repeated_4gram_mean": round(statistics.mean(a["repeated_4gram"] for a in answers), 3),
            "tokens_mean": round(statistics.mean(tokens), 1),
            "tokens_median": statistics.median(tokens),
            "seconds": round(seconds, 1),
        }
        lines = [
            "settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()),
            "ended:    "
            + ", ".join(f"{ending} {counts[ending]}" for ending in ENDINGS)
            + f"  (of {total})",
            f"ended on their own or cut at a loop: {figures['ended_well_pct']} %; "
            f"cut at the token limit: {figures['length_pct']} %",
            f"repeated word 4-grams: {figures['repeated_4gram_mean']:.3f} (mean share); "
            f"tokens per answer: mean {figures['tokens_mean']}, median {figures['tokens_median']}; "
            f"{figures['seconds']} s",
        ]
        return {"settings": settings, "figures": figures, "lines": lines}
