"""A real daphne process on loopback, for tests and benchmarks that need a real socket or browser."""

from __future__ import annotations

import atexit
import json
import os
import secrets
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent


def default_database(workdir: Path) -> str:
    """The suite's own kind of database: a fresh PostgreSQL one on its PostgreSQL pass, else SQLite."""
    suite = os.environ.get("DATABASE_URL", "")
    if suite.startswith(("postgres://", "postgresql://")):
        return fresh_database_like(suite)
    return f"sqlite:///{workdir / 'live.sqlite3'}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fresh_database_like(url: str) -> str:
    """A new, empty PostgreSQL database on the server `url` names, dropped when this process
    exits (after every server on it has stopped), so a live server on the suite's PostgreSQL
    pass stores on PostgreSQL, as production does."""
    import psycopg

    parts = urlsplit(url)
    admin = f"host={parts.hostname} port={parts.port or 5432} user={parts.username} dbname=postgres"
    name = f"{parts.path.lstrip('/') or 'chat'}_live_{secrets.token_hex(6)}"
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    atexit.register(drop)
    return urlunsplit(parts._replace(path=f"/{name}"))


class LiveServer:
    """daphne serving project.asgi on a free port with its own database: SQLite, or a fresh
    PostgreSQL database where the suite itself runs on PostgreSQL (DATABASE_URL).

    Give `database_url` (and the same Redis in `env`) to several servers to run
    them as one site spread over processes; `env` sets any further variables.
    With `serve`, it runs `python -m project.serve` (what `make run` runs: with REDIS_URL
    unset, the checkout's embedded Redis) instead of daphne alone; `daphne_flags` are passed to
    daphne besides its address and port (a deploy file's, say). `root` is the checkout it
    serves (another one's code, to measure two versions side by side).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        database_url: str | None = None,
        serve: bool = False,
        daphne_flags: tuple[str, ...] = (),
        root: Path = ROOT,
        **env: str,
    ):
        self.root = root
        settings_source = (root / "project" / "settings.py").read_text()
        # Settings reads each variable by its quoted name: a substring would let `CHAT_LIMIT` pass.
        stale = [
            k
            for k in env
            if k.startswith("CHAT_")
            and not k.startswith("CHAT_TEST_")
            and f'"{k}"' not in settings_source
        ]
        if stale:  # a renamed setting would otherwise be ignored silently, and the test mean less
            raise ValueError(f"project/settings.py reads no {', '.join(stale)}")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws/chat/"
        self.log_path = workdir / f"daphne-{self.port}.log"
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url or default_database(workdir),
            "PYTHONUNBUFFERED": "1",
            "PORT": str(self.port),  # part of CHAT_INSTANCE: two servers on one database stay apart
            "CHAT_METRICS_TOKEN": secrets.token_urlsafe(16),  # what `metrics` scrapes with
            **env,
        }
        self.serve = serve
        self.daphne_flags = list(daphne_flags)
        self.process: subprocess.Popen | None = None
        self.launched = 0.0
        self.ready_s: float | None = None

    def start(self, timeout: float = 180, *, wait_for_model: bool = True) -> LiveServer:
        """Migrate, start daphne, and return once /healthz says ready (or answers at all, without
        `wait_for_model`: a server with CHAT_BACKEND=none never reports ready)."""
        self.migrate()
        self.launch()
        return self.wait_ready(timeout, wait_for_model=wait_for_model)

    def migrate(self) -> None:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v0"], cwd=self.root, env=self.env, check=True
        )

    def launch(self) -> None:
        """Start the process, its database already migrated; `wait_ready` waits for it."""
        log = self.log_path.open("ab")
        daphne = [
            *("daphne", "-b", "127.0.0.1", "-p", str(self.port), *self.daphne_flags),
            "project.asgi:application",
        ]
        self.process = subprocess.Popen(
            [sys.executable, "-m", *(["project.serve"] if self.serve else daphne)],
            cwd=self.root,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.launched = time.monotonic()

    def wait_ready(self, timeout: float = 180, *, wait_for_model: bool = True) -> LiveServer:
        assert self.process is not None, "launch() first"
        launched = self.launched
        deadline = launched + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"daphne exited with {self.process.returncode}:\n{self.log()}")
            status = self.health()[0]
            if status == 200 or (status and not wait_for_model):
                self.ready_s = time.monotonic() - launched  # daphne started -> /healthz answered
                return self
            time.sleep(0.25)
        raise RuntimeError(f"daphne not ready after {timeout} s:\n{self.log()}")

    @staticmethod
    def start_together(servers: list[LiveServer], timeout: float = 180) -> list[LiveServer]:
        """Start servers that share a database side by side: it is migrated once, then every
        process starts and loads its model at the same time rather than each after the one
        before. Returns them ready; all are stopped if one fails to start."""
        migrated: set[str] = set()
        try:
            for server in servers:
                if server.env["DATABASE_URL"] not in migrated:
                    server.migrate()
                    migrated.add(server.env["DATABASE_URL"])
            for server in servers:
                server.launch()
            for server in servers:
                server.wait_ready(timeout)
        except BaseException:
            for server in servers:
                server.stop()
            raise
        return servers

    def restart(self, timeout: float = 180) -> LiveServer:
        """Stop daphne and start it again on the same port and database (start-up migrates, as `make run` does)."""
        self.stop()
        return self.start(timeout)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process and self.process.poll() is None else None

    def manage(self, *args: str) -> str:
        """Run a manage.py command against this server's database."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
        )
        if done.returncode:  # what the command said, not only that it failed
            raise RuntimeError(
                f"manage.py {args[0]} failed ({done.returncode}): {done.stderr[-3000:]}"
            )
        return done.stdout

    def policy(self, slug: str, **fields) -> None:
        """Store an output policy `slug` with `fields` (plain Python values), unless it exists."""
        fields.setdefault("name", slug)
        self.manage(
            "shell",
            "-c",
            "from chat.models import OutputPolicy as P; "
            f"P.objects.get_or_create(slug={slug!r}, defaults={fields!r})",
        )

    def health(self) -> tuple[int, dict | None]:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except OSError:
            return 0, None

    def metrics(self) -> str:
        """/metrics as Prometheus scrapes it: with the server's bearer token."""
        request = urllib.request.Request(
            self.url + "/metrics",
            headers={"Authorization": f"Bearer {self.env['CHAT_METRICS_TOKEN']}"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def query(self, sql: str, params: tuple = ()) -> list[dict]:
        """Rows from the server's own database, as dicts: SQL with `?` placeholders, on SQLite
        or PostgreSQL alike (a test reads what the server stored, not what it says it did)."""
        url = self.env["DATABASE_URL"]
        if url.startswith("sqlite:///"):
            path = url.removeprefix("sqlite:///").partition("?")[0]
            with sqlite3.connect(path) as db:
                db.row_factory = sqlite3.Row
                return [dict(row) for row in db.execute(sql, params)]
        import psycopg
        from psycopg.rows import dict_row
        from psycopg.types.json import set_json_loads

        with psycopg.connect(url, row_factory=dict_row) as db:
            set_json_loads(lambda data: bytes(data).decode(), db)  # JSON as text, as SQLite has it
            return list(db.execute(sql.replace("?", "%s"), params).fetchall())

    def stop(self) -> None:
        """SIGTERM, as a service manager stops it: running answers get CHAT_TIMEOUTS drain."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            timeouts = self.env.get("CHAT_TIMEOUTS", "").split(",")
            spec = dict(item.split("=", 1) for item in timeouts if "=" in item)
            drain = float(spec.get("drain", 10))
            try:
                self.process.wait(drain + 20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def process_status_mb(pid: int | None, key: str) -> float | None:
    """A size from another process's /proc status ("VmRSS", "VmHWM", ...) in MB, or None if it is gone."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
