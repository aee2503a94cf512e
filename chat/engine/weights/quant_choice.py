"""CHAT_ENGINE quant=: a weight mode applied to the loaded model, and `auto`'s choice at start-up.

"gguf" and "gguf-q8" compute the GGUF file's own blocks (gguf_blocks.py, blockquant.py); "int8"
and "int4" torch's weight-only kernels (quantized.py); "none" leaves the float weights. `auto`
(local/backend.py) times a decode step per candidate at load and keeps the fastest whose quality
was measured acceptable (docs/engine.md, bench/scripts/quant_trial.py), remembering a decisive
choice per machine (start_choices.py). `simulate` gives a mode's weights to float linears, for
measuring its quality where its kernels are slow.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import blockquant
from .gguf_blocks import gguf_int4_layers, gguf_q4_1_parts, quantize_blocks
from .quantized import (
    GROUP,
    QuantLinear,
    int4_parts,
    int4_weight,
    int8_parts,
    kernels_available,
    output_linear,
    projections,
    quantize,
    restore,
)
from .start_choices import StartChoices, decisive

log = logging.getLogger(__name__)

MODES = ("auto", "none", "int8", "int4", "gguf", "gguf-q8")


def simulate(model: nn.Module, mode: str, *, gguf_path: str | Path | None = None) -> list[Any]:
    """Give every projection the float weight `mode` would compute with, in plain nn.Linears.

    For measuring a mode's quality (perplexity, eos, pass rates) on a CPU whose kernels for it are
    slow: the same weights, computed by the float matmul (logits agree with the kernels' within
    the tolerance tests/test_quantized.py checks). A tied LM head gets a weight of its own, so the
    embedding keeps looking up the float table, as in the real mode. Returns the undo list.
    """
    if mode not in ("int8", "int4"):
        raise ValueError(f"simulate mode {mode!r}: use int8 or int4")
    output = output_linear(model)
    gguf = gguf_q4_1_parts(gguf_path, model) if gguf_path and mode == "int4" else {}
    undo = []
    for parent, name, child, linear, qualified in projections(model):
        if mode == "int8" or linear is output or linear.in_features % GROUP:
            q, scales = int8_parts(linear.weight)
            weight = q.float() * scales[:, None]
        elif qualified in gguf:
            weight = int4_weight(*gguf[qualified])
        else:
            weight = int4_weight(*int4_parts(linear.weight))
        layer = nn.Linear(linear.in_features, linear.out_features, bias=False)
        layer.weight = nn.Parameter(weight.to(linear.weight.dtype), requires_grad=False)
        setattr(parent, name, layer)
        undo.append((parent, name, child))
    return undo


# `auto` keeps a mode only when its timed decode steps beat the model as loaded by this margin.
MARGIN = 0.9


# A kernel this much slower than the float matmul on one row of the largest projection is not
# timed as a whole step: where torch's kernel is not vectorized for the CPU (measured 2.6x to 5x
# slower per row on an AVX2-only EPYC) a step, and its prefill, would cost seconds at start-up.
PROBE_LIMIT = 1.5


def probe(linear: nn.Linear, layer: QuantLinear, repeats: int = 20) -> float:
    """Seconds of `layer` over those of `linear` on one row (best of `repeats` each, alternating)."""
    row = torch.randn(1, linear.in_features, dtype=linear.weight.dtype)
    best = {"float": float("inf"), "quant": float("inf")}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, module in (("float", linear), ("quant", layer)):
                started = time.perf_counter()
                module(row)
                best[name] = min(best[name], time.perf_counter() - started)
    return best["quant"] / best["float"]


def choose(
    model: nn.Module,
    mode: str,
    time_steps: Callable[[], float],
    *,
    gguf_path: str | Path | None = None,
    progress: Callable[[str], None] = log.info,
    remembered: StartChoices | None = None,
    machine: dict[str, Any] | None = None,
) -> str:
    """Quantize the model's linears per `mode`; returns a line for the start-up log.

    "gguf", "int8", "int4" apply that mode. "auto" tries the modes the quality figures allow
    (AUTO_CANDIDATES, in order of preference): for torch's kernels a one-row probe of the largest
    projection first; then `time_steps` (the seconds of representative decode steps) against the
    model as loaded, keeping the first that beats the float model by MARGIN. "none" leaves the
    model alone.

    `remembered`: where auto's decisive choices are kept, keyed by `machine` (the CPU, torch,
    threads, weights) and the candidates, so a later start on the same key skips the timing.
    """
    if mode not in MODES:
        raise ValueError(f"CHAT_ENGINE quant={mode!r}: use one of {', '.join(MODES)}")
    if mode == "none":
        return "weights not quantized (CHAT_ENGINE quant=none)"
    if model.device.type != "cpu":
        if mode == "auto":
            return f"weights not quantized: no weight-only kernel for {model.device.type} here"
        raise ValueError(f"CHAT_ENGINE quant={mode}: there is no such kernel for {model.device}")
    if mode != "auto":
        unavailable = _unavailable(mode, progress)
        if unavailable:
            raise ValueError(f"CHAT_ENGINE quant={mode}: {unavailable}")
        _, from_gguf = _apply(model, mode, gguf_path)
        return f"weights {mode} (CHAT_ENGINE quant={mode}){_source(mode, from_gguf)}"
    if not AUTO_CANDIDATES:
        return (
            "weights not quantized (auto): no mode has yet matched fp32's quality "
            "(CHAT_ENGINE quant=gguf, int4 or int8 forces one)"
        )
    key = _auto_key(machine)
    if remembered is not None:
        line = _remembered_choice(model, remembered.get("quant", key), gguf_path, progress)
        if line is not None:
            return line
    best, line, timings = _measured_choice(model, time_steps, gguf_path, progress)
    if remembered is not None and decisive(timings):
        remembered.put("quant", key, {"mode": best, "timings": timings})
    return line


def _auto_key(machine: dict[str, Any] | None) -> dict[str, Any]:
    """What auto's remembered choice is filed under: the machine, the candidates, the kernels."""
    key = {**(machine or {}), "candidates": list(AUTO_CANDIDATES), "margin": MARGIN}
    key["kernels"] = hashlib.sha256(
        b"".join(source.read_bytes() for source in blockquant.SOURCES)
    ).hexdigest()[:16]
    return key


def decided_block_mode(
    mode: str,
    *,
    remembered: StartChoices | None = None,
    machine: dict[str, Any] | None = None,
    progress: Callable[[str], None] = log.info,
) -> tuple[str, str] | None:
    """(block mode, why) when the weights will be GGUF blocks before anything is timed: forced,
    or `auto`'s choice remembered for this machine, with the kernels built; else None. The
    loader then builds the model around the kept blocks (around_blocks.py)."""
    why = f"CHAT_ENGINE quant={mode}"
    if mode == "auto":
        choice = _valid_choice(remembered.get("quant", _auto_key(machine)) if remembered else None)
        if choice is None:
            return None
        mode, why = choice[0], _remembered_why(choice[1])
    if mode not in ("gguf", "gguf-q8") or _unavailable(mode, progress):
        return None
    return mode, why


def _valid_choice(choice: dict[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
    """(mode, timings) of a remembered auto choice this version can apply, or None."""
    if choice is None:
        return None
    best, timings = choice.get("mode"), choice.get("timings")
    if best not in ("none", *AUTO_CANDIDATES) or not isinstance(timings, dict):
        return None
    return str(best), timings


def _remembered_why(timings: dict[str, Any]) -> str:
    return f"auto, as measured before on this machine: decode steps {_figures(timings)}"


def _figures(timings: dict[str, Any]) -> str:
    """Each mode's decode-step time, as the start-up log prints them."""
    return ", ".join(f"{name} {float(seconds) * 1000:.0f} ms" for name, seconds in timings.items())


def _remembered_choice(
    model: nn.Module,
    choice: dict[str, Any] | None,
    gguf_path: str | Path | None,
    progress: Callable[[str], None],
) -> str | None:
    """Apply a remembered auto choice; None when there is none usable (then auto measures)."""
    valid = _valid_choice(choice)
    if valid is None:
        return None
    best, timings = valid
    if best != "none":
        if _unavailable(best, progress):
            return None
        _, from_gguf = _apply(model, best, gguf_path)
    return f"weights {'not quantized' if best == 'none' else best} ({_remembered_why(timings)})" + (
        _source(best, from_gguf) if best != "none" else ""
    )


def _measured_choice(
    model: nn.Module,
    time_steps: Callable[[], float],
    gguf_path: str | Path | None,
    progress: Callable[[str], None],
) -> tuple[str, str, dict[str, float]]:
    """Time the candidates against the model as loaded and keep the best: (mode, log line,
    timings)."""
    timings: dict[str, float] = {}
    notes: list[str] = []
    applied: tuple[str, list[tuple[nn.Module, str, nn.Module]], int] | None = (
        None  # the candidate left in place after its timing
    )
    gate = _largest_projection(model)[1]  # probed while the float layers are in place
    for candidate in AUTO_CANDIDATES:
        unavailable = _unavailable(candidate, progress)
        if unavailable:
            notes.append(f"{candidate}: {unavailable}")
            continue
        if not candidate.startswith("gguf"):
            ratio = probe(gate, getattr(QuantLinear, candidate)(gate.weight))
            if ratio > PROBE_LIMIT:
                notes.append(f"{candidate} kernel {ratio:.1f}x float on one row, not tried")
                continue
        if applied is not None:
            restore(applied[1])
        elif not timings:
            timings["none"] = time_steps()
        undo, from_gguf = _apply(model, candidate, gguf_path)
        applied = (candidate, undo, from_gguf)
        timings[candidate] = time_steps()
    best = min(timings, key=timings.__getitem__) if timings else "none"
    if best != "none" and timings[best] >= timings["none"] * MARGIN:
        best = "none"
    if applied is not None and applied[0] != best:
        restore(applied[1])
        applied = None
    if best != "none" and applied is None:
        applied = (best, *_apply(model, best, gguf_path))
    line = _auto_line(best, timings, notes) + (_source(best, applied[2]) if applied else "")
    return best, line, timings


def _unavailable(mode: str, progress: Callable[[str], None]) -> str | None:
    """Why `mode` cannot run here, or None."""
    if mode in ("gguf", "gguf-q8"):
        if blockquant.kernels(progress) is None:
            return blockquant.failure()
        return None
    if not kernels_available():
        return "torch has no such CPU kernel in this build"
    return None


def _apply(
    model: nn.Module, mode: str, gguf_path: str | Path | None
) -> tuple[list[tuple[nn.Module, str, nn.Module]], int]:
    if mode in ("gguf", "gguf-q8"):
        return quantize_blocks(model, gguf_path=gguf_path, int8_activations=mode == "gguf-q8")
    blocks = gguf_int4_layers(gguf_path, model) if mode == "int4" and gguf_path else {}
    return quantize(model, mode, gguf_blocks=blocks)


def _auto_line(best: str, timings: dict[str, float], notes: list[str]) -> str:
    figures = _figures(timings)
    return (
        f"weights {'not quantized' if best == 'none' else best} (auto)"
        + (f": decode steps {figures}" if timings else "")
        + "".join(f"; {note}" for note in notes)
    )


def _largest_projection(model: nn.Module) -> tuple[str, nn.Linear]:
    """(name, layer) of the largest projection other than the LM head: what the probe times."""
    output = output_linear(model)
    name, linear = max(
        ((q, lin) for _, _, _, lin, q in projections(model) if lin is not output),
        key=lambda item: item[1].weight.numel(),
    )
    return name, linear


def _source(mode: str, from_gguf: int) -> str:
    if mode == "int4":
        return f", {from_gguf} layers from the GGUF's Q4_1 blocks"
    if mode in ("gguf", "gguf-q8"):
        return f", {from_gguf} layers read from the GGUF file's own blocks"
    return ""


# The modes `auto` may pick, in order of preference: those whose quality figures matched fp32's
# (docs/benchmarks.md). "gguf" computes the bundled file's own blocks in fp32 (the weights
# llama.cpp reads, without the bf16 rounding of the converted copy): perplexity -0.04 %, 19 of
# the 20 dtypecheck answers on eos as fp32. int8 (17/20), int4 (18/20) and gguf-q8 (18/20, its
# int8 activations) ended fewer, so they stay opt-in.
AUTO_CANDIDATES: tuple[str, ...] = ("gguf",)
