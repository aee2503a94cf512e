"""`python -m project.serve`: everything a fresh clone needs, then daphne.

Starts (or joins) the checkout's embedded Redis when REDIS_URL is unset, migrates, converts
the bundled model once, runs the system checks (the eos check warns here) and serves.
"""

import os
import subprocess
import sys
from pathlib import Path

from project.embedded_redis import EmbeddedRedis


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    base = Path(__file__).resolve().parent.parent
    data_dir = Path(os.environ.get("DATA_DIR", base / "var"))
    if os.environ.get("REDIS_URL"):
        serve(argv)
        return
    embedded = EmbeddedRedis(data_dir)
    os.environ["REDIS_URL"] = embedded.acquire()
    print(
        f"Embedded Redis on {embedded.socket_path}, shared by {len(embedded.users())} process(es) "
        "of this checkout (set REDIS_URL to use your own)",
        flush=True,
    )
    embedded.watch()
    try:
        serve(argv)
    finally:
        # Stopped only if no other process of this checkout still uses it.
        embedded.release()


def prepare_bundled_model(settings) -> None:
    """Convert the bundled model once, in this process unless it must stay torch-free."""
    if settings.CHAT_BACKEND != "openai":
        from chat.engine.loading import ensure_default_model

        ensure_default_model(settings.DATA_DIR, progress=lambda line: print(line, flush=True))
    elif not settings.CHAT_REMOTE_TOKENIZER:
        # In front of an inference server the bundled folder only serves as the tokenizer for
        # token counts. Converting it needs torch, which this process must not hold: a child
        # process does it (later starts find the folder and return at once).
        subprocess.run([sys.executable, "-m", "chat.engine.prepare"], check=True)


def serve(argv: list[str]) -> None:
    import django
    from django.conf import settings
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=1)
    if not settings.DEBUG:
        call_command("collectstatic", interactive=False, verbosity=0)
    if not settings.CHAT_MODEL_PATH:
        prepare_bundled_model(settings)
    call_command("check")

    from daphne.cli import CommandLineInterface

    host = os.environ.get("HOST", "127.0.0.1")
    port = os.environ.get("PORT", "8000")
    print(f"Serving on http://{host}:{port}/", flush=True)
    CommandLineInterface().run(["-b", host, "-p", port, *argv, "project.asgi:application"])


if __name__ == "__main__":
    main(sys.argv[1:])
