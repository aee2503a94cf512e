"""The product's /v1 against llama.cpp's own `llama-server`, measured in the same run, interleaved.

Both servers run side by side on the same GGUF file with the same client (openai_client.py) and
prompts, greedy. Each round measures, for each server in turn (the order swaps every round, so a
burst of other work on a shared machine lands on both): one stream, N concurrent users for each
level, and the newcomer (the first chunk of a request that arrives while `busy` answers decode).
The report gives per figure the median over rounds and the spread (min-max), and the ratio of
the medians. llama-server runs with as many slots as the product's batch.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

from .benchmarking import api_key, flush_cache_db, fmt, ratio
from .in_process import LONG_ANSWER, NEWCOMER
from .openai_client import Stream, Target, stream_chat, together


@dataclass
class Level:
    """N users at once in one round, as the client saw them."""

    streams: list[Stream]
    wall_s: float

    @property
    def complete(self) -> bool:
        return bool(self.streams) and all(s.ok for s in self.streams)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.streams)

    def aggregate_tps(self) -> float | None:
        return self.tokens / self.wall_s if self.complete and self.wall_s else None

    def per_user_tps(self) -> float | None:
        rates = [s.tokens / s.total_s for s in self.streams if s.ok and s.total_s]
        return statistics.median(rates) if rates and self.complete else None

    def first_chunk_ms(self, worst: bool = False) -> float | None:
        firsts = [s.first_chunk_ms for s in self.streams if s.first_chunk_ms is not None]
        if not firsts or len(firsts) != len(self.streams):
            return None
        return max(firsts) if worst else statistics.median(firsts)


@dataclass
class Side:
    """Every round's figures for one server."""

    target: Target
    levels: dict[int, list[Level]] = field(default_factory=dict)
    newcomer: list[Stream] = field(default_factory=list)
    newcomer_busy: list[bool] = field(default_factory=list)  # the others were still decoding
    ready_s: float | None = None
    peak_rss_mb: float | None = None


def sides(run, server, label: str, llama_label: str) -> tuple[Side, Side]:
    """The product's /v1 on a live daphne (`run`, a benchmarking.ServerRun) and a running
    LlamaServer, as the race's two sides; a repeated prompt is generated, not a cache hit."""
    product = Side(
        Target(
            label,
            "local",
            run.server.url + "/v1",
            "smollm2",
            key=api_key(run.server),
            reset=flush_cache_db,
        ),
        ready_s=run.ready_s,
    )
    llama = Side(
        Target(llama_label, "llama", server.base_url, server.model), ready_s=server.ready_s
    )
    return product, llama


def newcomer_among(target: Target, busy: int, tokens: int, round_no: int) -> tuple[Stream, bool]:
    """A newcomer's stream, sent once `busy` answers have all started decoding.

    The busy answers are closed once the newcomer's first chunk is in (the rest measures
    nothing); the flag says they were all still running when it came.
    """
    stop = threading.Event()
    started = [threading.Event() for _ in range(busy)]
    results: list[Stream | None] = [None] * busy

    def run(i: int) -> None:
        prompt = f"{LONG_ANSWER} (round {round_no}, voice {i})"
        results[i] = stream_chat(target, prompt, tokens, stop=stop, on_first=started[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(busy)]
    for thread in threads:
        thread.start()
    for event in started:
        event.wait(300)
    time.sleep(0.5)  # into the decode, past every prefill
    if target.reset:
        target.reset()
    newcomer = stream_chat(target, f"{NEWCOMER} (round {round_no})", 24)
    running = all(t.is_alive() for t in threads)
    stop.set()
    for thread in threads:
        thread.join(600)
    return newcomer, running


def race(
    sides: list[Side],
    *,
    prompt: str,
    tokens: int,
    levels: list[int],
    busy: int,
    rounds: int,
    note=print,
    newcomer: bool = True,
) -> None:
    """Fill each side's figures: `rounds` rounds, each measurement taken on every side in turn
    (the newcomer among `busy` too, unless `newcomer` is False)."""
    for side in sides:  # warm-up: first requests pay one-off allocations on either server
        warm = stream_chat(side.target, "Hi", 4)
        if not warm.ok:
            raise RuntimeError(f"{side.target.label}: warm-up failed: {warm.error}")
    for round_no in range(rounds):
        order = sides if round_no % 2 == 0 else list(reversed(sides))
        for users in levels:
            for side in order:
                note(f"  round {round_no + 1}/{rounds}: {side.target.label}, {users} user(s)")
                if side.target.reset:
                    side.target.reset()
                prompts = [
                    f"{prompt} (round {round_no}, user {k} of {users})" for k in range(users)
                ]
                streams, wall = together(side.target, prompts, tokens)
                side.levels.setdefault(users, []).append(Level(streams, wall))
        for side in order if newcomer else []:
            note(f"  round {round_no + 1}/{rounds}: {side.target.label}, newcomer among {busy}")
            stream, running = newcomer_among(side.target, busy, tokens, round_no)
            side.newcomer.append(stream)
            side.newcomer_busy.append(running)


def spread(values: list[float | None]) -> tuple[float | None, float | None, float | None]:
    """(median, min, max) of the measured values; Nones when a round failed."""
    known = [v for v in values if v is not None]
    if not known or len(known) != len(values):
        return None, None, None
    return statistics.median(known), min(known), max(known)


def cell(values: list[float | None], spec: str = ".1f") -> str:
    mid, low, high = spread(values)
    if mid is None:
        return "-"
    if len(values) == 1:
        return fmt(mid, spec)
    return f"{fmt(mid, spec)} ({fmt(low, spec)}-{fmt(high, spec)})"


def figures(side: Side) -> list[tuple[str, list[float | None], str]]:
    """(name, per-round values, format) for each row of the table."""
    rows: list[tuple[str, list[float | None], str]] = []
    for users, runs in sorted(side.levels.items()):
        rows.append(
            (f"{users:>2} user(s): aggregate tok/s", [r.aggregate_tps() for r in runs], ".1f")
        )
        rows.append(
            (f"{users:>2} user(s): tok/s per user", [r.per_user_tps() for r in runs], ".1f")
        )
        rows.append(
            (
                f"{users:>2} user(s): first chunk, median ms",
                [r.first_chunk_ms() for r in runs],
                ".0f",
            )
        )
        rows.append(
            (
                f"{users:>2} user(s): first chunk, worst ms",
                [r.first_chunk_ms(True) for r in runs],
                ".0f",
            )
        )
        rows.append(
            (
                f"{users:>2} user(s): tokens per answer",
                [r.tokens / len(r.streams) for r in runs],
                ".0f",
            )
        )
    rows.append(
        (
            "newcomer among the busy: first chunk ms",
            [s.first_chunk_ms if s.ok else None for s in side.newcomer],
            ".0f",
        )
    )
    return rows


def report(product: Side, llama: Side, *, slots: int, busy: int, rounds: int) -> list[str]:
    """The side-by-side table: every ratio is product / llama-server, so over 1x is the product
    ahead on a rate and behind on a time."""
    lines = [
        f"Against llama.cpp's llama-server (same GGUF, {slots} slots, same client and "
        f"prompts, greedy; median (min-max) of {rounds} interleaved round(s))",
    ]
    width = 26
    lines.append(
        f"  {'figure':42} {product.target.label[:width]:>{width}} {llama.target.label[:width]:>{width}}  product/llama"
    )
    lines.append(
        f"  {'start -> answering s':42} {fmt(product.ready_s, '.1f'):>{width}} {fmt(llama.ready_s, '.1f'):>{width}}"
    )
    mine, theirs = figures(product), figures(llama)
    for (name, values, spec), (_, others, _) in zip(mine, theirs, strict=True):
        x = ratio(spread(values)[0], spread(others)[0])
        lines.append(
            f"  {name:42} {cell(values, spec):>{width}} {cell(others, spec):>{width}}  {fmt(x, '.2f', 'x'):>13}"
        )
    lines.append(
        f"  {'peak RSS MB':42} {fmt(product.peak_rss_mb, '.0f'):>{width}} {fmt(llama.peak_rss_mb, '.0f'):>{width}}"
    )
    for side in (product, llama):
        if side.newcomer_busy and not all(side.newcomer_busy):
            lines.append(
                f"  note: {side.target.label}: in {side.newcomer_busy.count(False)} round(s) a busy "
                f"answer had ended before the newcomer's first chunk"
                + (" (every slot was taken: it waited for one)" if busy >= slots else "")
            )
        errors = sorted(
            {s.error for runs in side.levels.values() for r in runs for s in r.streams if s.error}
        )
        if errors:
            lines.append(f"  errors ({side.target.label}): {'; '.join(errors)[:300]}")
    lines.append(
        f"  tok/s per user: median of a user's tokens / (sent -> done); the newcomer arrives while "
        f"{busy} answers decode. Ratios: product / llama-server."
    )
    return lines


def targets(product: Side, llama: Side) -> list[tuple[str, str, str, bool | None]]:
    """The head-to-head targets of docs/benchmarks.md: (name, measured, target, met)."""

    def median_of(side: Side, users: int, how) -> float | None:
        return spread([how(r) for r in side.levels.get(users, [])] or [None])[0]

    lines = []
    one = ratio(
        median_of(product, 1, Level.aggregate_tps), median_of(llama, 1, Level.aggregate_tps)
    )
    lines.append(
        (
            "one stream tok/s: product / llama-server",
            fmt(one, ".2f", "x"),
            ">= 0.7x",
            None if one is None else one >= 0.7,
        )
    )
    if 8 in product.levels:
        eight = ratio(
            median_of(product, 8, Level.aggregate_tps), median_of(llama, 8, Level.aggregate_tps)
        )
        lines.append(
            (
                "8 users agg tok/s: product / llama-server",
                fmt(eight, ".2f", "x"),
                ">= 1.0x",
                None if eight is None else eight >= 1.0,
            )
        )
        worst = median_of(product, 8, lambda r: r.first_chunk_ms(True))
        lines.append(
            (
                "worst first chunk, 8 users (product /v1)",
                fmt(worst, ".0f", " ms"),
                "<= 2000 ms",
                None if worst is None else worst <= 2000,
            )
        )
    return lines
