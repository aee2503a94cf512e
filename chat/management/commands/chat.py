"""`manage.py chat`: stream an answer to the terminal, token by token (the seed's TextStreamer case)."""

import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from chat.engine.types import EngineError

from ..engine_loading import load


class Command(BaseCommand):
    help = "Chat with the model in the terminal; the answer streams as it is generated."

    def add_arguments(self, parser):
        parser.add_argument(
            "prompt", nargs="*", help="the prompt; omit it for an interactive session"
        )
        parser.add_argument("--max-new-tokens", type=int, default=settings.CHAT_MAX_NEW_TOKENS)
        parser.add_argument(
            "--stop", action="append", default=[], help="a stop string (repeatable)"
        )
        parser.add_argument("--temperature", type=float, default=0.0)

    def handle(self, *args, **options):
        backend = load(self)
        history: list[dict] = []
        prompt = " ".join(options["prompt"])
        interactive = not prompt
        while True:
            if interactive:
                try:
                    prompt = input("you> ").strip()
                except EOFError:
                    return
                if not prompt:
                    continue
            history.append({"role": "user", "content": prompt})
            request = backend.request(
                history,
                max_new_tokens=options["max_new_tokens"],
                stop_strings=tuple(options["stop"]),
                temperature=options["temperature"],
            )
            try:
                result = backend.generate(
                    request, on_text=lambda text: (sys.stdout.write(text), sys.stdout.flush())
                )
            except EngineError as exc:
                raise CommandError(str(exc)) from None
            history.append({"role": "assistant", "content": result.text})
            ttft = (result.first_token_at - result.started_at) if result.first_token_at else 0.0
            self.stderr.write(
                f"\n[{result.finish_reason}; {result.new_tokens} tokens; first token {ttft:.2f} s; "
                f"{result.tokens_per_s:.1f} tok/s]"
            )
            if not interactive:
                return
