"""A bounded load run against a real daphne on 127.0.0.1: many sockets, short prompts, cancels, then checks.

`run_load` starts its own daphne (harness/liveserver.py, its own SQLite file), creates a policy
with a small max_new_tokens there, and opens N WebSockets that each loop for T seconds:
send a short prompt, read its events, sometimes cancel (while queued or mid-stream). At the
deadline every running answer is cancelled and awaited, so the run stops by itself. Then it
reads the stored messages and checks each equals what its client assembled from its chunks,
counts errors by code, scans daphne's log for tracebacks and compares daphne's RSS at a
warmed-up baseline with after the run.

Loopback only; every wait has a timeout; the counts and the duration are the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import websockets

from chat.infra.stats import percentile
from harness.liveserver import LiveServer, process_status_mb

POLICY_SLUG = "loadtest"
PROMPTS = (
    "Say hi.",
    "Name a color.",
    "Name a fruit.",
    "What is 2 + 2?",
    "Count from 1 to 5.",
    "Give me one word for happy.",
    "Name an animal that can fly.",
    "What day comes after Monday?",
)
# Codes that say the server refused load, as opposed to failing.
REFUSALS = {"queue_full", "busy", "rate_limited"}
EVENT_TIMEOUT = 180.0  # one event; a bound, never an expectation
DRAIN_TIMEOUT = 180.0  # after the deadline, for the cancelled answers to end


@dataclass
class Turn:
    """What one client saw of one prompt."""

    request_id: str
    sent_at: float
    message: int | None = None
    conversation: int | None = None
    chunks: list[str] = field(default_factory=list)
    first_chunk_at: float | None = None
    done: dict | None = None
    done_at: float | None = None
    error: dict | None = None
    cancel: str | None = None  # "queued", "streaming" or "deadline": when the client sent cancel
    anomalies: list[str] = field(default_factory=list)

    @property
    def assembled(self) -> str:
        return "".join(self.chunks)


@dataclass
class ClientLog:
    turns: list[Turn] = field(default_factory=list)
    connect_error: str | None = None
    closed_early: str | None = None


@dataclass
class Report:
    """Everything measured and checked; `problems` empty means the run was clean."""

    sockets: int
    seconds: float
    max_new_tokens: int
    server_env: dict
    wall_s: float = 0.0
    clients: list[ClientLog] = field(default_factory=list)
    stored: dict[int, dict] = field(default_factory=dict)
    left_streaming: int = 0
    orphans: int = 0
    mismatches: list[str] = field(default_factory=list)
    tracebacks: int = 0
    error_lines: int = 0
    log_excerpt: str = ""
    rss_baseline_mb: float | None = None
    rss_peak_mb: float | None = None
    rss_after_mb: list[float | None] = field(default_factory=list)  # one per round, once settled
    rounds: int = 1

    @property
    def turns(self) -> list[Turn]:
        return [t for c in self.clients for t in c.turns]

    def error_codes(self) -> Counter:
        return Counter(t.error["code"] for t in self.turns if t.error)

    @property
    def server_errors(self) -> Counter:
        return Counter({code: n for code, n in self.error_codes().items() if code not in REFUSALS})

    @property
    def problems(self) -> list[str]:
        found = list(self.mismatches)
        found += [f"{n} x error {code}" for code, n in self.server_errors.items()]
        found += [f"{t.request_id}: {a}" for t in self.turns for a in t.anomalies]
        found += [
            f"client could not connect: {c.connect_error}" for c in self.clients if c.connect_error
        ]
        found += [
            f"socket closed by the server: {c.closed_early}" for c in self.clients if c.closed_early
        ]
        if self.left_streaming:
            found.append(f"{self.left_streaming} message(s) still streaming after the run")
        if self.orphans:
            found.append(f"{self.orphans} stored answer(s) no client asked for")
        if self.tracebacks:
            found.append(f"{self.tracebacks} traceback(s) in the daphne log")
        return found


# -- the server ---------------------------------------------------------------------


def rss_mb(pid: int | None) -> float | None:
    """Current resident set (VmRSS) of `pid` in MB, or None if it is gone."""
    return process_status_mb(pid, "VmRSS")


def load_server(workdir: Path, *, sockets: int, **env: str) -> LiveServer:
    """A daphne for the load: the queue holds every socket's prompt and the per-user rate limit is off.

    Without that, the load would mostly measure refusals (`queue_full`, `rate_limited`):
    each socket here is a new visitor, but 200 prompts at once exceed the default queue of 64.
    """
    return LiveServer(
        workdir,
        CHAT_LIMITS=f"queue={max(64, 2 * sockets)}",
        CHAT_RATE_LIMITS="prompt=0",
        **env,
    )


def policy_create(server: LiveServer, *, max_new_tokens: int) -> None:
    """A stream policy with short answers and no cache, so every prompt is really generated."""
    code = (
        "from chat.models import OutputPolicy as P; "
        f"P.objects.update_or_create(slug={POLICY_SLUG!r}, defaults=dict(name='Load test', mode='stream', "
        f"max_new_tokens={max_new_tokens}, stop_strings=['\\nUser:'], cache_enabled=False, moderation_hooks=[]))"
    )
    server.manage("shell", "-c", code)


def stored_messages(server: LiveServer) -> dict[int, dict]:
    """Every assistant message in the server's database, by id (read through the ORM, in its own process)."""
    code = (
        "import json; from chat.models import Message as M; "
        "print(json.dumps(list(M.objects.filter(role='assistant').values("
        "'id', 'text', 'status', 'finish_reason', 'error', 'conversation_id'))))"
    )
    return {
        row["id"]: row
        for row in json.loads(server.manage("shell", "-c", code).strip().splitlines()[-1])
    }


def scan_log(text: str) -> tuple[int, int, str]:
    """(tracebacks, ERROR lines, an excerpt around the first traceback) in a daphne log."""
    lines = text.splitlines()
    tracebacks = sum(1 for line in lines if line.startswith("Traceback (most recent call last)"))
    errors = sum(1 for line in lines if " ERROR " in line)
    excerpt = ""
    for index, line in enumerate(lines):
        if line.startswith("Traceback"):
            excerpt = "\n".join(lines[max(0, index - 2) : index + 25])
            break
    return tracebacks, errors, excerpt


# -- the clients ---------------------------------------------------------------------


class Client:
    """One socket: prompts in a loop until the deadline, recording what it saw."""

    def __init__(
        self,
        number: int,
        server: LiveServer,
        *,
        deadline: float,
        rng: random.Random,
        cancel_share: float,
        continue_share: float,
    ):
        self.number = number
        self.server = server
        self.deadline = deadline
        self.rng = rng
        self.cancel_share = cancel_share
        self.continue_share = continue_share
        self.log = ClientLog()

    async def run(self) -> ClientLog:
        try:
            ws = await websockets.connect(
                self.server.ws_url, origin=self.server.url, open_timeout=60, max_queue=None
            )
        except Exception as exc:  # counted, never raised: one failed socket must not end the run
            self.log.connect_error = f"{type(exc).__name__}: {exc}"
            return self.log
        try:
            conversation = None
            while time.monotonic() < self.deadline:
                if self.rng.random() >= self.continue_share:
                    conversation = None
                turn = await self._turn(ws, conversation)
                if turn.done is not None:
                    conversation = turn.conversation
                if turn.error is not None and turn.error.get("code") not in REFUSALS:
                    conversation = None
        except websockets.ConnectionClosed as exc:
            self.log.closed_early = f"{exc}"
        finally:
            await ws.close()
        return self.log

    async def _turn(self, ws, conversation: int | None) -> Turn:
        turn = Turn(
            request_id=f"s{self.number}-{len(self.log.turns) + 1}", sent_at=time.monotonic()
        )
        self.log.turns.append(turn)
        # Some prompts are cancelled: as soon as accepted (usually still queued), or after a few chunks.
        plan = None
        if self.rng.random() < self.cancel_share:
            plan = self.rng.choice(["queued", "streaming"])
        cancel_after = self.rng.randint(1, 4)
        await ws.send(
            json.dumps(
                {
                    "type": "prompt",
                    "request_id": turn.request_id,
                    "text": self.rng.choice(PROMPTS),
                    "conversation": conversation,
                    "policy": POLICY_SLUG,
                }
            )
        )
        while turn.done is None and turn.error is None:
            remaining = self.deadline - time.monotonic()
            if turn.cancel is None and remaining <= 0:
                await self._cancel(ws, turn, "deadline")
            timeout = (
                EVENT_TIMEOUT
                if turn.cancel is not None or remaining <= 0
                else min(EVENT_TIMEOUT, remaining)
            )
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout)
            except TimeoutError:
                if timeout < EVENT_TIMEOUT:
                    continue  # the deadline came first: loop to cancel
                turn.anomalies.append(f"no event for {EVENT_TIMEOUT:.0f} s")
                return turn
            event = json.loads(raw)
            self._record(turn, event)
            if event.get("request_id") != turn.request_id or turn.cancel is not None:
                continue
            if plan == "queued" and event["type"] == "accepted":
                await self._cancel(ws, turn, "queued")
            elif (
                plan == "streaming"
                and event["type"] == "chunk"
                and len(turn.chunks) >= cancel_after
            ):
                await self._cancel(ws, turn, "streaming")
        return turn

    async def _cancel(self, ws, turn: Turn, when: str) -> None:
        turn.cancel = when
        await ws.send(json.dumps({"type": "cancel", "request_id": turn.request_id}))

    @staticmethod
    def _record(turn: Turn, event: dict) -> None:
        kind = event.get("type")
        if event.get("request_id") != turn.request_id:
            turn.anomalies.append(f"event for another request: {event}")
            return
        if turn.done is not None or turn.error is not None:
            turn.anomalies.append(f"{kind} after the answer ended")
            return
        if kind == "accepted":
            turn.message, turn.conversation = event["message"], event["conversation"]
        elif kind == "chunk":
            turn.first_chunk_at = turn.first_chunk_at or time.monotonic()
            turn.chunks.append(event["text"])
        elif kind == "done":
            turn.done, turn.done_at = event, time.monotonic()
            if turn.message is not None and event.get("message") != turn.message:
                turn.anomalies.append(
                    f"done names message {event.get('message')}, accepted said {turn.message}"
                )
        elif kind == "error":
            turn.error = event
        elif kind not in {"queued", "buffering"}:
            turn.anomalies.append(f"unexpected event {kind}")


async def drive(
    server: LiveServer,
    *,
    sockets: int,
    seconds: float,
    seed: int,
    cancel_share: float,
    continue_share: float,
) -> tuple[list[ClientLog], float]:
    """Run `sockets` clients for `seconds`, then until every cancelled answer ended (bounded)."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    clients = [
        Client(
            n,
            server,
            deadline=deadline,
            rng=random.Random(rng.random()),
            cancel_share=cancel_share,
            continue_share=continue_share,
        )
        for n in range(1, sockets + 1)
    ]
    started = time.monotonic()
    tasks = [asyncio.create_task(c.run()) for c in clients]
    done, pending = await asyncio.wait(tasks, timeout=seconds + DRAIN_TIMEOUT + 60)
    for task in pending:
        task.cancel()
    logs = []
    for client, task in zip(clients, tasks, strict=True):
        if task in done and task.exception() is None:
            logs.append(task.result())
        else:
            client.log.closed_early = client.log.closed_early or "client did not finish in time"
            logs.append(client.log)
    return logs, time.monotonic() - started


# -- checks ---------------------------------------------------------------------------


def check(report: Report) -> None:
    """Compare what every client assembled with what the server stored."""
    expected_ids = set()
    for turn in report.turns:
        if turn.message is None:
            continue
        expected_ids.add(turn.message)
        row = report.stored.get(turn.message)
        if row is None:
            report.mismatches.append(f"{turn.request_id}: message {turn.message} was never stored")
            continue
        if turn.error is not None:
            if row["status"] != "failed" and turn.error["code"] == "model_error":
                report.mismatches.append(
                    f"{turn.request_id}: model_error but stored as {row['status']}"
                )
            continue
        if turn.done is None:
            continue  # counted as an anomaly already
        done = turn.done
        want_status = "cancelled" if done["finish_reason"] == "cancelled" else "done"
        if done["text"] != turn.assembled:
            report.mismatches.append(
                f"{turn.request_id}: done.text differs from the chunks it sent"
            )
        if row["text"] != turn.assembled:
            report.mismatches.append(
                f"{turn.request_id}: stored text {row['text']!r} != assembled chunks {turn.assembled!r}"
            )
        if (row["status"], row["finish_reason"]) != (want_status, done["finish_reason"]):
            report.mismatches.append(
                f"{turn.request_id}: stored {row['status']}/{row['finish_reason']}, "
                f"done said {want_status}/{done['finish_reason']}"
            )
    report.left_streaming = sum(1 for row in report.stored.values() if row["status"] == "streaming")
    report.orphans = len(set(report.stored) - expected_ids)


# -- the whole run ----------------------------------------------------------------------


async def _sample_peak(pid: int | None, stop: asyncio.Event, report: Report) -> None:
    while not stop.is_set():
        value = rss_mb(pid)
        if value is not None:
            report.rss_peak_mb = max(report.rss_peak_mb or 0.0, value)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


def run_load(
    workdir: Path,
    *,
    sockets: int = 200,
    seconds: float = 60.0,
    rounds: int = 1,
    max_new_tokens: int = 12,
    warmup_seconds: float = 10.0,
    settle_seconds: float = 5.0,
    cancel_share: float = 0.3,
    continue_share: float = 0.5,
    seed: int = 1,
    server_env: dict | None = None,
    progress=print,
) -> Report:
    """Start a daphne, warm it up, measure its RSS, run the load, settle, measure again, check everything.

    The warm-up uses as many sockets as the load, so the baseline has seen every kind of work once;
    with several rounds, RSS after each tells a plateau (allocator high-water) from a leak (growth).
    """
    server_env = dict(server_env or {})
    server = load_server(workdir, sockets=sockets, **server_env)
    report = Report(
        sockets=sockets,
        seconds=seconds,
        rounds=rounds,
        max_new_tokens=max_new_tokens,
        server_env={
            "CHAT_LIMITS": server.env["CHAT_LIMITS"],
            "CHAT_RATE_LIMITS": "prompt=0",
            **server_env,
        },
    )
    progress(f"starting daphne on {server.url} (its own database in {workdir})")
    server.start()
    log_start = server.log_path.stat().st_size  # start-up's 503s from /healthz are not the load's
    try:
        policy_create(server, max_new_tokens=max_new_tokens)
        if warmup_seconds > 0:
            progress(f"warm-up: {sockets} sockets for {warmup_seconds:.0f} s")
            asyncio.run(
                drive(
                    server,
                    sockets=sockets,
                    seconds=warmup_seconds,
                    seed=seed + 1000,
                    cancel_share=cancel_share,
                    continue_share=continue_share,
                )
            )
        time.sleep(settle_seconds)
        report.rss_baseline_mb = rss_mb(server.pid)
        progress(f"baseline RSS {report.rss_baseline_mb:.0f} MB")

        async def measured(round_seed: int):
            stop = asyncio.Event()
            sampler = asyncio.create_task(_sample_peak(server.pid, stop, report))
            try:
                return await drive(
                    server,
                    sockets=sockets,
                    seconds=seconds,
                    seed=round_seed,
                    cancel_share=cancel_share,
                    continue_share=continue_share,
                )
            finally:
                stop.set()
                await sampler

        for number in range(1, rounds + 1):
            progress(f"round {number}/{rounds}: {sockets} sockets for {seconds:.0f} s")
            clients, wall = asyncio.run(measured(seed + number))
            report.clients += clients
            report.wall_s += wall
            time.sleep(settle_seconds)
            report.rss_after_mb.append(rss_mb(server.pid))
            progress(f"  done in {wall:.1f} s; RSS after settling {report.rss_after_mb[-1]:.0f} MB")
        report.stored = stored_messages(server)
        # Only this run's answers: the warm-up's are in the same database.
        asked = {t.message for t in report.turns if t.message is not None}
        first = min(asked) if asked else None
        if first is not None:
            report.stored = {mid: row for mid, row in report.stored.items() if mid >= first}
        check(report)
    finally:
        server.stop()
    with server.log_path.open("rb") as log:
        log.seek(log_start)
        report.tracebacks, report.error_lines, report.log_excerpt = scan_log(
            log.read().decode(errors="replace")
        )
    return report


# -- figures ------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def figures(report: Report) -> str:
    """The report as a plain-text table."""
    turns = report.turns
    done = [t for t in turns if t.done is not None]
    finishes = Counter(t.done["finish_reason"] for t in done)
    cancels = Counter(t.cancel for t in turns if t.cancel)
    tokens = sum((t.done.get("metrics") or {}).get("new_tokens") or 0 for t in done)
    chunks = sum(len(t.chunks) for t in turns)
    first = [t.first_chunk_at - t.sent_at for t in turns if t.first_chunk_at is not None]
    whole = [t.done_at - t.sent_at for t in done if t.done["finish_reason"] != "cancelled"]
    queue = [(t.done.get("metrics") or {}).get("queue_ms") for t in done]
    queue = [q / 1000 for q in queue if q is not None]
    connected = sum(1 for c in report.clients if not c.connect_error)
    busy = report.seconds * report.rounds
    baseline = report.rss_baseline_mb or 0.0
    after = (
        ", ".join(f"{a or 0:.0f} MB ({(a or 0) - baseline:+.0f})" for a in report.rss_after_mb)
        or "-"
    )
    errors = report.error_codes()
    rows = [
        (
            "server",
            f"daphne on 127.0.0.1, {', '.join(f'{k}={v}' for k, v in report.server_env.items())}",
        ),
        (
            "load",
            f"{report.sockets} sockets x {report.seconds:.0f} s x {report.rounds} round(s), policy '{POLICY_SLUG}' "
            f"(stream, max_new_tokens={report.max_new_tokens}, cache off); wall {report.wall_s:.1f} s incl. drain",
        ),
        (
            "sockets",
            f"{connected}/{len(report.clients)} connections opened, "
            f"{sum(1 for c in report.clients if c.closed_early)} closed by the server",
        ),
        (
            "prompts",
            f"{len(turns)} sent, {len(done)} done, {sum(1 for t in turns if t.error)} error",
        ),
        ("finish", ", ".join(f"{k} {v}" for k, v in sorted(finishes.items())) or "-"),
        ("cancels sent", ", ".join(f"{k} {v}" for k, v in sorted(cancels.items())) or "-"),
        ("errors by code", ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "none"),
        (
            "generated",
            f"{tokens} tokens in {chunks} chunks; {tokens / busy:.1f} tok/s, "
            f"{len(done) / busy:.2f} answers/s over the {busy:.0f} s of prompting",
        ),
        (
            "first chunk",
            f"p50 {_ms(percentile(first, 50))}, p95 {_ms(percentile(first, 95))} (client: prompt sent -> chunk)",
        ),
        (
            "whole answer",
            f"p50 {_ms(percentile(whole, 50))}, p95 {_ms(percentile(whole, 95))} (not cancelled)",
        ),
        (
            "queue (server)",
            f"p50 {_ms(percentile(queue, 50))}, p95 {_ms(percentile(queue, 95))}",
        ),
        (
            "integrity",
            f"{len([t for t in turns if t.message is not None])} answers checked against the database: "
            f"{len(report.mismatches)} mismatch(es), {report.left_streaming} left streaming, "
            f"{report.orphans} orphan(s), "
            f"{sum(len(t.anomalies) for t in turns)} protocol anomaly(ies)",
        ),
        (
            "server log",
            f"{report.tracebacks} traceback(s), {report.error_lines} ERROR line(s) once ready",
        ),
        (
            "memory (RSS)",
            f"baseline {baseline:.0f} MB (warmed up), peak during the load {report.rss_peak_mb or 0:.0f} MB, "
            f"after each round (settled) {after}",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"  {name:<{width}}  {value}" for name, value in rows]
    problems = report.problems
    lines.append(
        f"  {'verdict':<{width}}  " + ("clean" if not problems else f"{len(problems)} problem(s)")
    )
    lines += [f"    - {p}" for p in problems[:20]]
    if report.log_excerpt:
        lines += ["  first traceback in the daphne log:", report.log_excerpt]
    return "\n".join(lines)
