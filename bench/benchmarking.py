"""Helpers for `manage.py benchmark`: figures, loopback WebSocket clients, daphne servers (the
timed generate calls in process are in_process.py).

Everything here talks to 127.0.0.1 only. Every wait is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from harness.liveserver import process_status_mb

LOOPBACK = "127.0.0.1"
# The benchmark's servers use these Redis databases; the cache one is flushed between runs.
CACHE_REDIS_URL = os.environ.get("BENCH_CACHE_REDIS_URL", "redis://127.0.0.1:6379/13")
CHANNEL_REDIS_URL = "redis://127.0.0.1:6379/0"  # when REDIS_URL is unset (see daphne())
CHAT_STOP_STRINGS = ("\nUser:",)  # the `chat` policy's stop string (migration 0003)
CACHEABLE = ("eos", "stop_string")  # chat.stores.cache.CACHEABLE_FINISH


# -- figures --------------------------------------------------------------------


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, spec: str = ".1f", unit: str = "", missing: str = "-") -> str:
    return missing if value is None else f"{value:{spec}}{unit}"


def ratio(a, b) -> float | None:
    return None if a is None or not b else a / b


def self_peak_rss_mb() -> float:
    """Peak RSS of this process (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def process_peak_rss_mb(pid: int) -> float | None:
    """VmHWM (peak resident set) of another process, or None if it is gone."""
    return process_status_mb(pid, "VmHWM")


def loopback_url(url: str | None, default: str) -> str:
    """`url` if it points at this machine's loopback, else `default`: no traffic leaves 127.0.0.1."""
    if url and urlsplit(url).hostname in {LOOPBACK, "localhost"}:
        return url
    return default


def flush_cache_db(url: str = CACHE_REDIS_URL) -> int:
    """Empty the benchmark's own Redis database; returns how many keys were there."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        keys: int = client.dbsize()  # type: ignore[assignment]  # sync client; redis-py types both
        client.flushdb()
        return keys
    finally:
        client.close()


def cache_db_size(url: str = CACHE_REDIS_URL) -> int | None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        size: int = client.dbsize()  # type: ignore[assignment]  # sync client; redis-py types both
        return size
    except (redis.RedisError, OSError):
        return None
    finally:
        client.close()


async def wait_for_cache_size(minimum: int, timeout: float = 5.0) -> bool:
    """The cache is written just after `done` goes out; wait (bounded) until it holds `minimum` keys."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        size = await asyncio.to_thread(cache_db_size)
        if size is not None and size >= minimum:
            return True
        await asyncio.sleep(0.05)
    return False


# -- WebSocket client -------------------------------------------------------------


@dataclass
class Answer:
    """One prompt as a client saw it; times in ms from the moment the prompt frame was sent."""

    prompt: str
    connect_ms: float | None = None
    sent_at: float | None = None  # perf_counter
    done_at: float | None = None  # perf_counter
    first_event_ms: float | None = None
    first_chunk_ms: float | None = None
    done_ms: float | None = None
    chunks: int = 0
    text: str = ""
    done: dict | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.done is not None

    @property
    def metrics(self) -> dict:
        return (self.done or {}).get("metrics") or {}

    @property
    def new_tokens(self) -> int:
        return int(self.metrics.get("new_tokens") or 0)

    @property
    def cached(self) -> bool:
        return bool((self.done or {}).get("cached"))

    @property
    def finish_reason(self) -> str | None:
        return (self.done or {}).get("finish_reason")

    @property
    def ttft_client_ms(self) -> float | None:
        """Prompt sent -> first chunk; an answer without any chunk counts its done."""
        return self.first_chunk_ms if self.first_chunk_ms is not None else self.done_ms


def _connect(server):
    import websockets

    # proxy=None: never route loopback traffic through a proxy taken from the environment.
    return websockets.connect(
        server.ws_url, origin=server.url, proxy=None, open_timeout=10, close_timeout=2
    )


async def converse(
    ws, answer: Answer, request_id: str, timeout: float, policy: str | None = None
) -> Answer:
    """Send one prompt on an open socket and read events until its done or error (bounded)."""
    frame_fields = {"type": "prompt", "request_id": request_id, "text": answer.prompt}
    frame = json.dumps(
        {**frame_fields, "conversation": None, **({"policy": policy} if policy else {})}
    )
    answer.sent_at = time.perf_counter()
    await ws.send(frame)
    deadline = answer.sent_at + timeout
    parts: list[str] = []
    for _ in range(
        100_000
    ):  # far more events than any answer sends; the deadline is the real bound
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            answer.error = f"no done within {timeout:.0f} s"
            break
        try:
            raw = await asyncio.wait_for(ws.recv(), remaining)
        except TimeoutError:
            answer.error = f"no done within {timeout:.0f} s"
            break
        now = time.perf_counter()
        event = json.loads(raw)
        if event.get("request_id") not in (request_id, None):
            continue
        elapsed = (now - answer.sent_at) * 1000
        if answer.first_event_ms is None:
            answer.first_event_ms = elapsed
        kind = event.get("type")
        if kind == "chunk":
            answer.chunks += 1
            parts.append(event.get("text", ""))
            if answer.first_chunk_ms is None:
                answer.first_chunk_ms = elapsed
        elif kind == "done":
            answer.done, answer.done_ms, answer.done_at = event, elapsed, now
            break
        elif kind == "error":
            answer.error = f"{event.get('code')}: {event.get('message')}"
            answer.done_at = now
            break
    answer.text = "".join(parts)
    return answer


async def ask(server, prompt: str, request_id: str = "bench-1", timeout: float = 120) -> Answer:
    """A fresh connection, one prompt with conversation null, closed afterwards."""
    answer = Answer(prompt)
    started = time.perf_counter()
    try:
        async with _connect(server) as ws:
            answer.connect_ms = (time.perf_counter() - started) * 1000
            await converse(ws, answer, request_id, timeout)
    except (TimeoutError, OSError) as exc:
        answer.error = answer.error or f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # websockets' handshake and close errors
        answer.error = answer.error or f"{type(exc).__name__}: {exc}"
    return answer


async def ask_together(
    server, prompts: list[str], timeout: float, policy: str | None = None
) -> tuple[list[Answer], float]:
    """Open one connection per prompt, then send all prompts at once; (answers, wall seconds).

    Wall time runs from the first prompt sent to the last done received.
    """
    answers = [Answer(p) for p in prompts]
    async with contextlib.AsyncExitStack() as stack:
        sockets = []
        for answer in answers:
            started = time.perf_counter()
            sockets.append(await stack.enter_async_context(_connect(server)))
            answer.connect_ms = (time.perf_counter() - started) * 1000
        await asyncio.gather(
            *(
                converse(ws, a, f"bench-c{i}", timeout, policy)
                for i, (ws, a) in enumerate(zip(sockets, answers, strict=True))
            ),
            return_exceptions=True,
        )
    sent = [a.sent_at for a in answers if a.sent_at is not None]
    ended = [a.done_at for a in answers if a.done_at is not None]
    wall = (max(ended) - min(sent)) if sent and ended else 0.0
    return answers, wall


# -- daphne ---------------------------------------------------------------------------


def api_key(server) -> str:
    """A user `bench` and an API key for it in a LiveServer's database (the last line that
    `manage.py apikey create` prints)."""
    server.manage(
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model as U; "
        "U().objects.get_or_create(username='bench')",
    )
    return server.manage("apikey", "create", "--user", "bench").strip().splitlines()[-1]


@dataclass
class ServerRun:
    """A daphne started for the benchmark: how long it took to get ready and how big it got."""

    label: str
    env: dict
    ready_s: float | None = None
    peak_rss_mb: float | None = None
    log_tail: str = ""
    server: object = field(default=None, repr=False)


@contextlib.contextmanager
def daphne(workdir: Path, label: str, *, premigrate: bool, timeout: float = 120, **env: str):
    """Start `python -m project.serve` (timed from the start() call to /healthz 200); always
    stopped on exit.

    With `premigrate`, the database is migrated first, untimed, so start() meets a migrated
    database as a restarted server would (its own no-op migrate is still inside the timing).
    """
    from harness.liveserver import LiveServer

    env.setdefault("REDIS_URL", loopback_url(os.environ.get("REDIS_URL"), CHANNEL_REDIS_URL))
    env.setdefault("CHAT_CACHE_REDIS_URL", CACHE_REDIS_URL)
    # Every benchmark connection is its own visitor, but 20 hits or 8 users must never meet the limiter.
    env.setdefault("CHAT_RATE_LIMITS", "prompt=0")
    # As `make run` serves: `python -m project.serve`, DEBUG off. The bench settings' DEBUG
    # (inherited otherwise) wraps every SQL query in the debug cursor and keeps it: 8 users'
    # requests reached the engine 173 ms after they were sent with it, 149 without.
    env.setdefault("DEBUG", "0")
    server = LiveServer(workdir, serve=True, **env)
    run = ServerRun(label=label, env=env, server=server)
    try:
        if premigrate:
            server.manage("migrate", "-v0")
        started = time.perf_counter()
        server.start(timeout=timeout)
        run.ready_s = time.perf_counter() - started
        yield run
    finally:
        if server.process is not None:
            run.peak_rss_mb = process_peak_rss_mb(server.process.pid)
            with contextlib.suppress(OSError):
                run.log_tail = server.log()
        server.stop()


def _running(server) -> float | None:
    """The server's `chat_requests_running` gauge (/metrics): rows the model is generating."""
    import re

    found = re.search(r"^chat_requests_running (\S+)$", server.metrics(), re.M)
    return float(found.group(1)) if found else None


@dataclass
class ClosedTab:
    stopped_ms: float | None  # socket closed -> the model's last row of it gone; None: not seen
    ended_first: bool  # the answer ended on its own before the grace period was up


async def closed_tab_stop(server, prompt: str, timeout: float = 60) -> ClosedTab:
    """Close a socket at its answer's first chunk, as a closed tab does, and time until the
    model stops generating it (its running gauge back at 0): the grace period plus a step."""
    async with _connect(server) as ws:
        frame = {"type": "prompt", "request_id": "closed-tab", "text": f"{prompt} (a closed tab)"}
        await ws.send(json.dumps(frame))
        while json.loads(await asyncio.wait_for(ws.recv(), timeout))["type"] != "chunk":
            pass
    closed = time.perf_counter()
    while time.perf_counter() - closed < timeout:
        if await asyncio.to_thread(_running, server) == 0:
            stopped = (time.perf_counter() - closed) * 1000
            orphaned = await asyncio.to_thread(_orphaned, server)
            return ClosedTab(stopped, ended_first=not orphaned)
        await asyncio.sleep(0.02)
    return ClosedTab(None, ended_first=False)


def _orphaned(server) -> bool:
    """Whether the server counted an answer stopped for want of a listener."""
    import re

    counts = re.findall(r"^chat_answers_orphaned_total\{[^}]*\} (\S+)$", server.metrics(), re.M)
    return sum(float(c) for c in counts) > 0
