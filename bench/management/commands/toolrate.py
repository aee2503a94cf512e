"""`manage.py toolrate`: how often `tool_choice: "auto"` calls a tool when the prompt needs one.

Twenty fixed prompts, each clearly needing one of four tools, asked as `/v1` asks them: the
default policy with the tools in its system prompt and the worked example (`overridden`,
fit_prompt, request_for: the same code as a turn), greedy. Each way is counted: a valid call
(a listed function with valid arguments), the right function, prose instead of a call, an
invalid answer. The ways: "auto" under the grammar (what /v1 does) and "required" (a call is
forced: every answer should be a valid call); `--unconstrained` adds "auto" without the
grammar. Ten prompts that need no tool say how often "auto" calls one anyway.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from django.core.management.base import BaseCommand

from chat.engine.sampling_params import SamplingChanges
from chat.management.engine_loading import load
from chat.policy import ToolSpec
from chat.policy.tool_calls import judge_calls
from chat.stores.policy_store import PolicyOverride, builtin_policy, policy_for
from chat.turns.prepare import overridden
from chat.turns.prompting import fit_prompt, request_for


def _object(**properties: str) -> dict:
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": list(properties),
    }


TOOLS = (
    ("get_weather", "The current weather in a city.", _object(city="string")),
    (
        "convert_currency",
        "Convert an amount of money from one currency to another at today's rate.",
        _object(amount="number", source="string", target="string"),
    ),
    ("get_time", "The current local time in a city.", _object(city="string")),
    ("get_stock_price", "The latest price of a company's stock.", _object(ticker="string")),
)

PROMPTS = (
    ("What is the weather in Paris right now?", "get_weather"),
    ("Is it raining in London today?", "get_weather"),
    ("How hot is it in Cairo at the moment?", "get_weather"),
    ("Check the current weather in Tokyo for me.", "get_weather"),
    ("Will I need an umbrella in Seattle right now?", "get_weather"),
    ("Convert 100 US dollars to euros.", "convert_currency"),
    ("How many Japanese yen is 50 British pounds today?", "convert_currency"),
    ("What is 20 euros in Swiss francs at today's rate?", "convert_currency"),
    ("Exchange 75 Canadian dollars into US dollars.", "convert_currency"),
    ("I have 300 Indian rupees. How much is that in euros?", "convert_currency"),
    ("What time is it in New York right now?", "get_time"),
    ("Tell me the current local time in Sydney.", "get_time"),
    ("What is the time in Berlin at this moment?", "get_time"),
    ("Is it morning or evening in Mumbai right now? Check the time.", "get_time"),
    ("What's the local time in Rio de Janeiro?", "get_time"),
    ("What is Apple's stock price right now?", "get_stock_price"),
    ("Look up the latest share price of Microsoft (MSFT).", "get_stock_price"),
    ("How much is one Tesla share trading for today?", "get_stock_price"),
    ("Get me the current stock price of Amazon.", "get_stock_price"),
    ("What is NVDA trading at right now?", "get_stock_price"),
)

NO_TOOL_PROMPTS = (
    "Say hello.",
    "Write a haiku about the sea.",
    "What is 2 plus 2?",
    "Who wrote Hamlet?",
    "Tell me a joke.",
    "Translate 'thank you' into French.",
    "What is a noun?",
    "Give me a synonym for happy.",
    "How do I boil an egg?",
    "What color is the sky?",
)


class Command(BaseCommand):
    help = 'How often tool_choice "auto" calls the right tool when the prompt needs one.'

    def add_arguments(self, parser):
        parser.add_argument("--prompts", type=int, default=len(PROMPTS))
        parser.add_argument("--max-new-tokens", type=int, default=80)
        parser.add_argument(
            "--unconstrained", action="store_true", help='also "auto" without the grammar'
        )

    def handle(self, *args, prompts, max_new_tokens, unconstrained, **options):
        backend = load(self)
        try:
            policy = policy_for(None)
        except Exception:  # no database migrated: the server's built-in default
            policy = builtin_policy()
        ways = [
            ('"auto", constrained (as /v1)', "auto", True),
            *([('"auto", unconstrained', "auto", False)] if unconstrained else []),
            ('"required", constrained', "required", True),
        ]
        self.stdout.write(
            f"{prompts} prompts that need a tool, 4 tools, policy {policy.slug}, greedy, "
            f"max_new_tokens={max_new_tokens}\n"
        )
        self.stdout.write(
            f"{'way':30} {'called':>7} {'right tool':>10} {'prose':>6} {'invalid':>7} "
            f"{'median s':>9} {'called, no tool needed':>23}"
        )
        for name, choice, constrained in ways:
            spec = ToolSpec(functions=TOOLS, choice=choice)
            greedy = SamplingChanges(replaced={"temperature": 0.0}, max_new_tokens=max_new_tokens)
            turn_policy = replace(
                overridden(policy, PolicyOverride(tools=spec), greedy), cache_enabled=False
            )
            called = right = prose = invalid = 0
            seconds = []
            for question, expected in PROMPTS[:prompts]:
                start = time.perf_counter()
                text = self._answer(backend, turn_policy, question, constrained)
                seconds.append(time.perf_counter() - start)
                judged = judge_calls(text, spec)
                if judged.error:
                    invalid += 1
                elif judged.calls:
                    called += 1
                    right += judged.calls[0].name == expected
                else:
                    prose += 1
            needless = "-"
            if choice == "auto":
                count = sum(
                    bool(
                        judge_calls(self._answer(backend, turn_policy, q, constrained), spec).calls
                    )
                    for q in NO_TOOL_PROMPTS
                )
                needless = f"{count}/{len(NO_TOOL_PROMPTS)}"
            self.stdout.write(
                f"{name:30} {called:>3}/{prompts:<3} {right:>6}/{prompts:<3} {prose:>6} "
                f"{invalid:>7} {statistics.median(seconds):>9.2f} {needless:>23}"
            )

    @staticmethod
    def _answer(backend, policy, question: str, constrained: bool) -> str:
        messages, _, input_ids = fit_prompt(backend, policy, [], question)
        request = request_for(backend, policy, input_ids, "toolrate", messages)
        if not constrained:
            request = replace(request, params=request.params.with_changes(tool_grammar=None))
        return backend.generate(request).text
