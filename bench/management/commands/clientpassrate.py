"""`manage.py clientpassrate`: how often each structured-output client library gets a valid object from /v1.

Every mode of harness/client_modes.py (the openai SDK, instructor, pydantic-ai, LangChain, each
as its users call it) asks a daphne of its own, on the local engine, to pull one person out of
each text of bench/prompts/extraction.json. Per mode: valid parsed objects, how many of them hold
the expected values, the re-asks the library made, and the time from the call to the object.
"""

import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from bench import benchmarking as bm
from harness import client_modes as cm


class Command(BaseCommand):
    help = "Valid parsed objects, re-asks and time per structured-output client mode, against its own daphne."

    def add_arguments(self, parser):
        parser.add_argument(
            "--prompts", type=int, default=0, help="how many texts (default: all of them)"
        )
        parser.add_argument("--max-tokens", type=int, default=64)
        parser.add_argument(
            "--reasks",
            type=int,
            default=2,
            help="re-asks a library may make after an invalid answer (instructor, pydantic-ai)",
        )
        parser.add_argument(
            "--mode", action="append", default=[], help="only modes whose label contains this"
        )
        parser.add_argument(
            "--url", default="", help="measure this /v1 instead of starting a daphne (with --key)"
        )
        parser.add_argument("--key", default="")

    def handle(self, *args, prompts, max_tokens, reasks, mode, url, key, **options):
        texts = cm.load_prompts()
        texts = texts[:prompts] if prompts else texts
        modes = [m for m in cm.MODES if not mode or any(part in m[0] for part in mode)]
        if not texts or not modes:
            raise CommandError("no prompts or no mode to measure")
        if url:
            if not key:
                raise CommandError("--url needs --key")
            # Another server's cache is not ours to empty: a mode may get an earlier mode's answers.
            self.measure(cm.Endpoint(url, key, max_tokens=max_tokens, reasks=reasks), modes, texts)
            return
        bm.flush_cache_db()  # every answer generated, none from an earlier run's cache
        with tempfile.TemporaryDirectory(prefix="clientpassrate-") as workdir:
            self.stderr.write("starting daphne (local engine)")
            with bm.daphne(Path(workdir), "clients", premigrate=False) as run:
                endpoint = cm.Endpoint(
                    run.server.url + "/v1",
                    bm.api_key(run.server),
                    max_tokens=max_tokens,
                    reasks=reasks,
                )
                # Modes that send the same request would be served each other's cached answers.
                self.measure(endpoint, modes, texts, between_modes=bm.flush_cache_db)

    def measure(self, endpoint: cm.Endpoint, modes, texts, between_modes=None) -> None:
        self.stdout.write(
            f"{len(texts)} texts, greedy, max_tokens={endpoint.max_tokens}, "
            f"re-asks allowed={endpoint.reasks}, one request at a time, "
            f"{'the completion cache emptied before each mode' if between_modes else 'cache left as it is'}\n"
        )
        header = f"{'client and mode':36} {'schema':>6} {'valid':>7} {'right':>6} {'re-asks':>7} {'median s':>8} {'max s':>6}"
        self.stdout.write(header)
        failures: dict[str, list[str]] = {}
        for label, ask, sends_schema in modes:
            if between_modes is not None:
                between_modes()
            outcomes = []
            for item in texts:
                outcome = cm.attempt(ask, endpoint, item["text"])
                outcomes.append(outcome)
                if outcome.error:
                    failures.setdefault(label, []).append(f"{item['text']!r}: {outcome.error}")
            valid = [o for o in outcomes if o.parsed is not None]
            right = sum(
                o.parsed.model_dump() == item["expected"]
                for o, item in zip(outcomes, texts, strict=True)
                if o.parsed is not None
            )
            seconds = [o.seconds for o in valid]
            self.stdout.write(
                f"{label:36} {'sent' if sends_schema else 'prompt':>6} "
                f"{len(valid):>3}/{len(texts):<3} {right:>6} {sum(o.reasks for o in outcomes):>7} "
                f"{bm.fmt(bm.median(seconds), '.2f'):>8} {bm.fmt(max(seconds, default=None), '.1f'):>6}"
            )
        self.stdout.write(
            "\nschema: sent = the schema or tools go to the server; prompt = only described in the prompt"
            "\nvalid: parsed objects that validate; right: of those, name, age and city as expected"
            "\nre-asks: requests after the first (the library's own retries); times: call -> object, valid ones"
        )
        if failures:
            self.stdout.write("\nFailed asks (the first of each mode):")
            for label, errors in failures.items():
                self.stdout.write(f"  {label}: {len(errors)}, first {errors[0]}")
