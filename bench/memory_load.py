"""The `make run` process's memory after real use: the load run's sockets, then pasted documents.

One fresh `python -m project.serve` (what `make run` starts, DEBUG off) per configuration:
its RSS once warm, then `make loadtest`'s clients (harness/loadtest.py: short prompts, cancels,
Continue) for some seconds, then several ~6,000-token documents at once over the socket, then
its RSS, VmHWM and /proc/PID/smaps_rollup's split once it has settled. Configurations differ
only in the environment (the allocator candidates); each starts on the same load, one after
another in one run, so their figures stand side by side.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness import loadtest
from harness.liveserver import LiveServer, process_status_mb

from . import benchmarking as bm
from .documents import document

JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
# The allocator candidates, by name: the environment each adds to the shipped process (glibc's
# defaults and the engine's malloc_trim after documents; a fixed threshold measured ~20% slower
# at 8 users, docs/operations.md "Memory").
CANDIDATES: dict[str, dict[str, str]] = {
    "shipped": {},
    # The threshold glibc's own rule climbs to after a few big frees: the allocator as it was.
    "MALLOC_MMAP_THRESHOLD_=32MB": {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024)},
    "MALLOC_MMAP_THRESHOLD_=1MB": {"MALLOC_MMAP_THRESHOLD_": str(1024 * 1024)},
    "MALLOC_ARENA_MAX=2": {"MALLOC_ARENA_MAX": "2"},
    "jemalloc": {"LD_PRELOAD": str(JEMALLOC)},
}
TARGET_RSS_MB = 1.2 * 1024
SOCKETS = 16  # the load run's users
DOCUMENTS = 4  # ~6,000-token documents sent at once after it
DOCUMENT_TIMEOUT_S = 900.0  # all documents together; a bound, never an expectation
SETTLE_S = 5.0
START_TIMEOUT_S = 900.0  # the model's load on a busy machine; a bound, never an expectation


@dataclass
class MemoryRun:
    """One configuration's figures (MB; None when the process was gone)."""

    label: str
    env: dict[str, str]
    rss_warm_mb: float | None = None
    rss_after_load_mb: float | None = None
    rss_mb: float | None = None
    hwm_mb: float | None = None
    anonymous_mb: float | None = None
    file_mb: float | None = None
    prompts: int = 0
    documents_done: int = 0
    document_prompt_tokens: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def smaps_rollup_mb(pid: int | None) -> dict[str, float]:
    """/proc/PID/smaps_rollup's sizes in MB ("Rss", "Anonymous", ...); empty if it is gone."""
    sizes: dict[str, float] = {}
    if pid is None:
        return sizes
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return sizes
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            sizes[name.strip()] = int(parts[0]) / 1024
    return sizes


async def _documents(server: LiveServer, count: int, tag: str) -> list[bm.Answer]:
    prompts = [document(f"{tag}-{n}") for n in range(1, count + 1)]
    answers, _ = await bm.ask_together(
        server, prompts, DOCUMENT_TIMEOUT_S, policy=loadtest.POLICY_SLUG
    )
    return answers


def measure(
    workdir: Path,
    label: str,
    env: dict[str, str],
    *,
    sockets: int,
    seconds: float,
    documents: int,
    redis_url: str,
    note: Callable[[str], None],
) -> MemoryRun:
    """Start a `make run` process with `env`, put the load on it, and read its memory."""
    run = MemoryRun(label, env)
    started = time.monotonic()
    folder = workdir / f"memory-{len(list(workdir.glob('memory-*')))}"
    folder.mkdir(parents=True)
    server = LiveServer(
        folder,
        serve=True,
        DEBUG="0",  # as `make run` serves (DEBUG would also keep every SQL query)
        REDIS_URL=redis_url,
        CHAT_LIMITS=f"queue={max(64, 2 * sockets)}",
        CHAT_RATE_LIMITS="prompt=0",
        **env,
    )
    note(f"  {label}: starting `python -m project.serve` on {server.url}")
    try:
        server.start(timeout=START_TIMEOUT_S)
        loadtest.policy_create(server, max_new_tokens=12)
        run.rss_warm_mb = loadtest.rss_mb(server.pid)
        note(f"  {label}: {sockets} sockets for {seconds:.0f} s (RSS {bm.fmt(run.rss_warm_mb)} MB)")
        logs, _ = asyncio.run(
            loadtest.drive(
                server,
                sockets=sockets,
                seconds=seconds,
                seed=1,
                cancel_share=0.3,
                continue_share=0.5,
            )
        )
        run.prompts = sum(len(log.turns) for log in logs)
        run.rss_after_load_mb = loadtest.rss_mb(server.pid)
        note(f"  {label}: {documents} documents at once (RSS {bm.fmt(run.rss_after_load_mb)} MB)")
        answers = asyncio.run(_documents(server, documents, label))
        run.documents_done = sum(1 for a in answers if a.done)
        run.document_prompt_tokens = [
            a.done.get("metrics", {}).get("prompt_tokens", 0) for a in answers if a.done
        ]
        run.errors = [a.error for a in answers if a.error]
        time.sleep(SETTLE_S)
        run.rss_mb = loadtest.rss_mb(server.pid)
        run.hwm_mb = process_status_mb(server.pid, "VmHWM")
        rollup = smaps_rollup_mb(server.pid)
        run.anonymous_mb = rollup.get("Anonymous")
        if "Rss" in rollup and run.anonymous_mb is not None:
            run.file_mb = rollup["Rss"] - run.anonymous_mb
        note(f"  {label}: RSS {bm.fmt(run.rss_mb)} MB, VmHWM {bm.fmt(run.hwm_mb)} MB")
    finally:
        server.stop()
        run.wall_s = time.monotonic() - started
    return run


def report(runs: list[MemoryRun], *, sockets: int, seconds: float, documents: int) -> list[str]:
    lines = [
        f"The `make run` process after the load: {sockets} sockets of the load run for "
        f"{seconds:.0f} s, then {documents} ~6,000-token documents at once; MB",
        f"  {'configuration':26} {'warm':>6} {'load':>6} {'after':>6} {'VmHWM':>6} "
        f"{'anon':>6} {'file':>6}  prompts  documents",
    ]
    for run in runs:
        tokens = ",".join(str(t) for t in run.document_prompt_tokens) or "-"
        lines.append(
            f"  {run.label:26} {bm.fmt(run.rss_warm_mb):>6} {bm.fmt(run.rss_after_load_mb):>6} "
            f"{bm.fmt(run.rss_mb):>6} {bm.fmt(run.hwm_mb):>6} {bm.fmt(run.anonymous_mb):>6} "
            f"{bm.fmt(run.file_mb):>6}  {run.prompts:>7}  {run.documents_done}/{documents} "
            f"({tokens} tokens)"
        )
        if run.errors:
            lines.append(f"    errors: {'; '.join(sorted(set(run.errors)))[:300]}")
    lines.append(
        "  warm: ready and idle; load: after the sockets; after: after the documents and "
        f"{SETTLE_S:.0f} s; anon/file: smaps_rollup's anonymous and file-backed resident parts"
    )
    return lines


def targets(runs: list[MemoryRun]) -> list[tuple[str, str, str, bool | None]]:
    shipped = next((run for run in runs if run.label == "shipped"), None)
    rss = shipped.rss_mb if shipped else None
    hwm = shipped.hwm_mb if shipped else None
    return [
        (
            "`make run` process after the load: RSS",
            f"{bm.fmt(rss, '.0f', ' MB')} (VmHWM {bm.fmt(hwm, '.0f', ' MB')})",
            f"<= {TARGET_RSS_MB / 1024:.1f} GB",
            None if rss is None else rss <= TARGET_RSS_MB,
        )
    ]
