"""Both engines busy at once through one web process: the default engine (the local model)
answering its policy while a remote engine (llama-server on the bundled GGUF) answers another,
each engine's tokens per second beside its figure alone.

Each round measures, in turn (the order swaps every round): the default engine's policy alone
(`users` streams at once), the remote engine's policy alone, then both at once (`users`
streams each). The report gives per engine the median aggregate tok/s over rounds, alone and
with the other busy, and their ratio; the target is at least 0.9x each. A remote engine on
another machine is the production shape; on one machine the two engines share its cores, so
the row then measures that contention as much as the product.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field

from .benchmarking import fmt, ratio
from .openai_client import Stream, Target, together

TARGET = 0.9


@dataclass
class Engine:
    """One engine's policy as /v1 names it, and its aggregate tok/s per round."""

    name: str
    target: Target
    alone: list[float | None] = field(default_factory=list)
    busy: list[float | None] = field(default_factory=list)
    errors: set[str] = field(default_factory=set)

    def median(self, figures: list[float | None]) -> float | None:
        measured = [figure for figure in figures if figure is not None]
        return statistics.median(measured) if measured else None


def _rate(engine: Engine, streams: list[Stream], wall: float) -> float | None:
    """Tokens per second of the streams together, or None when one failed."""
    engine.errors.update(s.error for s in streams if s.error)
    if not streams or not all(s.ok for s in streams) or not wall:
        return None
    return sum(s.tokens for s in streams) / wall


def _prompts(prompt: str, engine: Engine, round_no: int, users: int, how: str) -> list[str]:
    # Distinct prompts: identical ones in flight would share one generation (and the cache).
    return [
        f"{prompt} ({engine.name}, {how}, round {round_no}, user {k} of {users})"
        for k in range(users)
    ]


def _run_into(
    results: dict[str, tuple[list[Stream], float]], engine: Engine, prompts: list[str], tokens: int
) -> None:
    results[engine.name] = together(engine.target, prompts, tokens)


def race(
    engines: list[Engine], *, prompt: str, tokens: int, users: int, rounds: int, note=print
) -> None:
    """Fill each engine's figures alone and with the other busy, `rounds` rounds."""
    for round_no in range(rounds):
        order = engines if round_no % 2 == 0 else list(reversed(engines))
        for engine in order:
            note(f"  round {round_no + 1}/{rounds}: {engine.name} alone, {users} stream(s)")
            streams, wall = together(
                engine.target, _prompts(prompt, engine, round_no, users, "alone"), tokens
            )
            engine.alone.append(_rate(engine, streams, wall))
        note(f"  round {round_no + 1}/{rounds}: both engines at once, {users} stream(s) each")
        results: dict[str, tuple[list[Stream], float]] = {}
        threads = [
            threading.Thread(
                target=_run_into,
                args=(results, engine, _prompts(prompt, engine, round_no, users, "both"), tokens),
            )
            for engine in engines
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for engine in engines:
            engine.busy.append(_rate(engine, *results[engine.name]))


def report(engines: list[Engine], *, users: int, rounds: int, cpus: int) -> list[str]:
    lines = [
        f"Both engines busy at once through one web process ({users} stream(s) each, aggregate "
        f"tok/s, median of {rounds} round(s))",
        f"  {'engine':42} {'alone':>12} {'both busy':>12}  busy/alone",
    ]
    for engine in engines:
        alone, busy = engine.median(engine.alone), engine.median(engine.busy)
        lines.append(
            f"  {engine.name:42} {fmt(alone):>12} {fmt(busy):>12}  "
            f"{fmt(ratio(busy, alone), '.2f', 'x'):>10}"
        )
        if engine.errors:
            lines.append(f"  errors ({engine.name}): {'; '.join(sorted(engine.errors))[:300]}")
    lines.append(
        f"  note: both engines run on this machine's {cpus} CPU(s) here, so each takes cores "
        f"from the other and {TARGET}x is out of reach by construction; the production shape "
        f"is a remote engine on another machine, where only the web process is shared"
    )
    return lines


def targets(engines: list[Engine]) -> list[tuple[str, str, str, bool | None]]:
    """(name, measured, target, met) per engine: its tok/s with the other busy / alone."""
    found = []
    for engine in engines:
        x = ratio(engine.median(engine.busy), engine.median(engine.alone))
        found.append(
            (
                f"both engines busy: {engine.name} / alone"[:50],
                fmt(x, ".2f", "x"),
                f">= {TARGET}x",
                None if x is None else x >= TARGET,
            )
        )
    return found
