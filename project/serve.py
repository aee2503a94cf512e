"""`python -m project.serve`: everything a fresh clone needs, then daphne.

Starts (or joins) the checkout's embedded Redis when REDIS_URL is unset; migrates, collects the
static files, converts the bundled model once and runs the system checks (the eos check warns
here), all in a child process that exits before this one serves.
DEBUG is off unless DEBUG=1 is set: a stranger gets the product's error pages, never a
traceback (docs/security.md).
"""

import os
import secrets
import subprocess
import sys
from pathlib import Path

from project.embedded_redis import EmbeddedRedis

# The argument on which `python -m project.serve` prepares (migrate, static files, model,
# checks) and exits: `serve` runs it in a child process.
PREPARE = "--prepare-and-exit"


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    base = Path(__file__).resolve().parent.parent
    data_dir = Path(os.environ.get("DATA_DIR", base / "var"))
    serve_defaults(data_dir)
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


def serve_defaults(data_dir: Path) -> None:
    """DEBUG off unless asked for; a secret key kept in `data_dir` unless one is given (with
    DEBUG too: settings have no fallback key). Only variables that project/settings.py reads
    (and docs/configuration.md lists) are read or set here."""
    if not os.environ.get("DEBUG"):
        os.environ["DEBUG"] = "0"
    if not os.environ.get("SECRET_KEY"):
        os.environ["SECRET_KEY"] = kept_secret_key(data_dir / "secret_key")


def kept_secret_key(path: Path) -> str:
    """The key in `path`, made (readable by this user only) the first time: sessions and
    password-reset links outlive a restart."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as file:
        key = secrets.token_urlsafe(50)
        file.write(key + "\n")
    return key


def prepare_bundled_model(settings) -> None:
    """Convert the bundled model once: in the preparing process, or in a child of it when the
    model's folder is only the tokenizer of a torch-free web tier."""
    if settings.CHAT_BACKEND != "openai":
        from chat.engine.weights.loading import ensure_default_model

        ensure_default_model(settings.DATA_DIR, progress=lambda line: print(line, flush=True))
    elif not settings.CHAT_REMOTE_TOKENIZER:
        # In front of an inference server the bundled folder only serves as the tokenizer for
        # token counts. Converting it needs torch, which this process must not hold: a child
        # process does it (later starts find the folder and return at once).
        subprocess.run(
            [
                sys.executable,
                "-m",
                "chat.engine.weights.convert",
                "--data-dir",
                str(settings.DATA_DIR),
            ]
            + ["--quant", settings.CHAT_MODEL_QUANT],
            check=True,
        )


def serve(argv: list[str]) -> None:
    # The migrations, the static files and the checks run in a child process: their imports
    # (every migration module, the checks' registries) would stay in the serving process for
    # its life, about 47 MB of a torch-free web process's 187.
    prepared = subprocess.run([sys.executable, "-m", "project.serve", PREPARE])
    if prepared.returncode != 0:
        sys.exit(prepared.returncode)
    import django
    from django.conf import settings

    django.setup()
    from daphne.cli import CommandLineInterface

    host, port = settings.SERVE_HOST, str(settings.SERVE_PORT)
    print(f"Serving on http://{host}:{port}/", flush=True)
    CommandLineInterface().run(["-b", host, "-p", port, *argv, "project.asgi:application"])


def prepare() -> None:
    """What the server needs before it serves: the database migrated, the static files
    collected (without DEBUG), the bundled model converted, the system checks run."""
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


if __name__ == "__main__":
    if sys.argv[1:] == [PREPARE]:  # the child `serve` starts, its environment already set
        prepare()
    else:
        main(sys.argv[1:])
