"""Where the local model runs and in which dtype: `auto` resolved for this machine (CUDA, MPS or
the CPU; bf16 only where it was measured to pay)."""

from __future__ import annotations

import torch


def pick_device(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux); empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def pick_dtype(requested: str, device: str) -> torch.dtype:
    if requested != "auto":
        return getattr(torch, requested)
    if device == "cuda":
        return torch.bfloat16
    if device == "cpu" and bf16_pays_on_this_cpu(cpu_flags()):
        return torch.bfloat16
    return torch.float32


def bf16_pays_on_this_cpu(flags: set[str]) -> bool:
    """Whether bf16 beats fp32 here, by what `manage.py dtypecheck` measured (2 cores each).

    The server mostly decodes batches, and an answer that misses its end-of-turn token runs on to
    max_new_tokens, so the batch of 8 and the eos count weigh more than one stream's speed.
    - AMX Xeon (amx_bf16): fp32 16.1 tok/s one stream, bf16 15.4; eos fp32 17/20, bf16 15/20: fp32.
    - AMD EPYC, avx512_bf16, no AMX (earlier): one stream fp32 12.2, bf16 19.5; 8 streams fp32 77,
      bf16 89; eos fp32 19/20, bf16 17/20. bf16 is faster but ends fewer answers: fp32, until a
      quiet rerun shows the speed worth it (BF16_ON_AVX512).
    - AMD EPYC, AVX2 only (2026-12-03): one stream fp32 16.3, bf16 21.9; 8 streams fp32 72.1, bf16
      37.0; eos fp32 19/20, bf16 17/20: fp32 (bf16 has no instructions here and halves a batch).
    """
    return BF16_ON_AVX512 and "avx512_bf16" in flags and "amx_bf16" not in flags


# Set from the dtypecheck figures on an avx512_bf16 CPU (see bf16_pays_on_this_cpu).
BF16_ON_AVX512 = False
