"""`manage.py loadtest`: N concurrent WebSockets for T seconds against a daphne of its own; prints the figures.

The logic is in chat/loadtest.py. Loopback only, bounded in sockets and seconds, stops by itself.
Exits 1 when a check failed (a mismatch, a server error, a traceback), so scripts can rely on it.
"""

import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from harness import loadtest

MAX_SOCKETS = 1000
MAX_SECONDS = 600


class Command(BaseCommand):
    help = "Load the chat with many concurrent WebSockets on 127.0.0.1, then check every stored answer."

    def add_arguments(self, parser):
        parser.add_argument(
            "--sockets",
            type=int,
            default=200,
            help=f"concurrent WebSockets (at most {MAX_SOCKETS})",
        )
        parser.add_argument(
            "--seconds",
            type=float,
            default=60.0,
            help=f"how long they prompt (at most {MAX_SECONDS})",
        )
        parser.add_argument(
            "--rounds",
            type=int,
            default=1,
            help="repeat the load; RSS after each round tells a plateau from a leak (at most 5)",
        )
        parser.add_argument(
            "--tokens", type=int, default=12, help="max_new_tokens of the load policy"
        )
        parser.add_argument(
            "--cancel-share", type=float, default=0.3, help="share of prompts the client cancels"
        )
        parser.add_argument(
            "--batch",
            type=int,
            default=None,
            help="CHAT_ENGINE batch= of the server (default: its own)",
        )
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument(
            "--workdir",
            default=None,
            help="keep the server's database and log here (default: a temp dir)",
        )

    def handle(self, *args, **options):
        sockets, seconds = options["sockets"], options["seconds"]
        if (
            not 1 <= sockets <= MAX_SOCKETS
            or not 0 < seconds <= MAX_SECONDS
            or not 1 <= options["rounds"] <= 5
        ):
            raise CommandError(
                f"--sockets must be 1..{MAX_SOCKETS}, --seconds 0..{MAX_SECONDS} and --rounds 1..5"
            )
        env = {"CHAT_ENGINE": f"batch={options['batch']}"} if options["batch"] else {}
        with tempfile.TemporaryDirectory(prefix="loadtest-") as scratch:
            workdir = Path(options["workdir"] or scratch)
            workdir.mkdir(parents=True, exist_ok=True)
            report = loadtest.run_load(
                workdir,
                sockets=sockets,
                seconds=seconds,
                rounds=options["rounds"],
                max_new_tokens=options["tokens"],
                cancel_share=options["cancel_share"],
                seed=options["seed"],
                server_env=env,
                progress=lambda line: self.stderr.write(line),
            )
            self.stdout.write(loadtest.figures(report))
        if report.problems:
            raise SystemExit(1)
