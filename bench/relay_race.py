"""The web tier as a relay: N users through the product's /v1 with `CHAT_BACKEND=openai` in front
of llama-server, against the same N users straight to that llama-server, co-located, rounds
interleaved (the order swaps every round). Per side the aggregate tok/s; for the web process its
CPU time over the relayed rounds (utime + stime from /proc) per token the clients received, and
its resident memory after the run. `manage.py benchmark --relay-only` runs it alone."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .benchmarking import fmt, ratio
from .openai_client import Target, together

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """Another process's CPU seconds so far, user and system."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


@dataclass
class RelaySide:
    """One side's rounds: aggregate tok/s each, and the tokens its clients received."""

    target: Target
    # In front of each prompt: one letter a side, so both sides' prompts are as long.
    tag: str
    tps: list[float | None] = field(default_factory=list)
    # Each round's slowest first chunk: a relay's request path delays every answer's start.
    worst_first_ms: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: set[str] = field(default_factory=set)

    @property
    def median_tps(self) -> float | None:
        known = [t for t in self.tps if t is not None]
        return statistics.median(known) if known and len(known) == len(self.tps) else None

    @property
    def median_worst_first_ms(self) -> float | None:
        return statistics.median(self.worst_first_ms) if self.worst_first_ms else None


@dataclass
class RelayRace:
    relay: RelaySide
    direct: RelaySide
    users: int
    rounds: int
    cpu_s: float = 0.0  # the web process's, over the relayed rounds
    rss_mb: float | None = None
    peak_rss_mb: float | None = None

    @property
    def cpu_ms_per_token(self) -> float | None:
        return 1000 * self.cpu_s / self.relay.tokens if self.relay.tokens else None

    @property
    def speed_ratio(self) -> float | None:
        return ratio(self.relay.median_tps, self.direct.median_tps)


def race(
    relay: Target,
    direct: Target,
    web_pid: int,
    *,
    users: int,
    tokens: int,
    rounds: int,
    prompt: str,
    note=print,
) -> RelayRace:
    """`rounds` interleaved rounds of `users` at once on each side; `web_pid` is the relay's.

    Both sides reach the same llama-server, which keeps each slot's last prompt and reuses its
    longest common prefix: a prompt the other side sent a moment before would be prefilled for
    one token instead of all of its own. So every prompt is new from its first word on (a tag in
    front: neither the relay's completion cache nor llama-server's slots hold any of it), and a
    warm-up of `users` at once fills every slot with the chat template's opening, so the first
    round's first side does not meet empty slots that the second side then finds filled."""
    result = RelayRace(RelaySide(relay, "r"), RelaySide(direct, "d"), users, rounds)
    for side in (result.relay, result.direct):  # warm-up: connections, slots, first allocations
        warm, _ = together(side.target, [f"[{side.tag} warm-up {k}] Hi" for k in range(users)], 4)
        failed = [s.error for s in warm if not s.ok]
        if failed:
            raise RuntimeError(f"{side.target.label}: warm-up failed: {failed[0]}")
    for round_no in range(rounds):
        sides = [result.relay, result.direct]
        for side in sides if round_no % 2 == 0 else sides[::-1]:
            note(f"  round {round_no + 1}/{rounds}: {side.target.label}, {users} users")
            prompts = [f"[{side.tag} {round_no}.{k}] {prompt}" for k in range(users)]
            before = process_cpu_s(web_pid) if side is result.relay else 0.0
            streams, wall = together(side.target, prompts, tokens)
            if side is result.relay:
                result.cpu_s += process_cpu_s(web_pid) - before
            received = sum(s.tokens for s in streams)
            side.tokens += received
            side.errors |= {s.error for s in streams if s.error}
            firsts = [s.first_chunk_ms for s in streams if s.first_chunk_ms is not None]
            if firsts:
                side.worst_first_ms.append(max(firsts))
            complete = all(s.ok for s in streams) and wall > 0
            side.tps.append(received / wall if complete else None)
    return result


def report(result: RelayRace) -> list[str]:
    width = 26
    relay, direct = result.relay, result.direct
    lines = [
        f"The web tier as a relay: {result.users} users through /v1 (CHAT_BACKEND=openai) in "
        f"front of llama-server, against the same {result.users} straight to it "
        f"({result.rounds} interleaved round(s), median)",
        f"  {'figure':42} {relay.target.label[:width]:>{width}} "
        f"{direct.target.label[:width]:>{width}}  relay/direct",
        f"  {'aggregate tok/s':42} {fmt(relay.median_tps, '.1f'):>{width}} "
        f"{fmt(direct.median_tps, '.1f'):>{width}}  {fmt(result.speed_ratio, '.2f', 'x'):>12}",
        f"  {'slowest first chunk ms (median of rounds)':42} "
        f"{fmt(relay.median_worst_first_ms, '.0f'):>{width}} "
        f"{fmt(direct.median_worst_first_ms, '.0f'):>{width}}",
        f"  {'tokens received':42} {relay.tokens:>{width}} {direct.tokens:>{width}}",
        f"  {'web process CPU ms per relayed token':42} "
        f"{fmt(result.cpu_ms_per_token, '.3f'):>{width}}",
        f"  {'web process RSS after the run MB (peak)':42} "
        f"{fmt(result.rss_mb, '.0f') + ' (' + fmt(result.peak_rss_mb, '.0f') + ')':>{width}}",
    ]
    for side in (relay, direct):
        if side.errors:
            lines.append(f"  errors ({side.target.label}): {'; '.join(sorted(side.errors))[:300]}")
    return lines


def targets(result: RelayRace) -> list[tuple[str, str, str, bool | None]]:
    """(name, measured, target, met) of the relay's rows in docs/benchmarks.md."""
    speed, cpu, rss = result.speed_ratio, result.cpu_ms_per_token, result.rss_mb
    return [
        (
            f"{result.users} users via the web tier / straight",
            fmt(speed, ".2f", "x"),
            ">= 0.95x",
            None if speed is None else speed >= 0.95,
        ),
        (
            "web CPU ms per relayed token",
            fmt(cpu, ".3f", " ms"),
            "<= 0.3 ms",
            None if cpu is None else cpu <= 0.3,
        ),
        (
            "web tier RSS after the relay run",
            fmt(rss, ".0f", " MB"),
            "<= 150 MB",
            None if rss is None else rss <= 150,
        ),
    ]
