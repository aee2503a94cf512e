"""Linears that read GGUF's own blocks (Q4_1 projections, a Q8_0 LM head) through AVX2 kernels.

A decode step of a small model reads every weight once, so its speed is set by the bytes the
weights take: 538 MB a token in fp32, about 95 MB as the bundled GGUF stores them (Q4_1
projections, 20 bytes per 32 weights; a Q8_0 embedding/LM head, 34 bytes per 32). torch's own
weight-only kernels are vectorized for AVX-512 only (quantized.py measured them 2.6x to 5x
slower than fp32 on an AVX2 CPU), so this module compiles small C++ kernels
(kernels/blockquant.cpp) with torch's extension builder, once per machine, and keeps the
weights exactly as the file stores them: the matmuls llama.cpp computes, with fp32 activations
(`gguf`) or, like llama.cpp, int8 ones (`gguf-q8`).

Rows beyond MAX_KERNEL_ROWS (a prefill chunk) are computed by dequantizing the layer's weight
into a scratch matrix and calling the float GEMM, whose blocking wins there.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels") / "blockquant.cpp"
# Bump when the C++ interface changes, so an old build is never imported.
EXTENSION = "chat_blockquant_v3"
GROUP = 32
Q8_0_BLOCK_BYTES = 34  # fp16 d, then 32 int8
GGML_Q8_0 = 8
# A decode step has a handful of rows; above this the dequantize-and-GEMM path is faster.
MAX_KERNEL_ROWS = 16

_lock = threading.Lock()
_kernels: Any = None
_failure: str | None = None


def cpu_supported() -> tuple[bool, str]:
    """Whether this CPU runs the kernels (x86-64 with AVX2 and FMA)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        return False, "cannot read /proc/cpuinfo"
    missing = [flag for flag in ("avx2", "fma", "f16c") if flag not in flags]
    if missing:
        return False, f"this CPU lacks {', '.join(missing)}"
    return True, ""


def build_directory() -> Path:
    """Where the compiled kernels are kept: one build per machine and torch version."""
    base = os.environ.get("CHAT_KERNEL_CACHE") or Path.home() / ".cache" / "chat-kernels"
    tag = f"torch-{torch.__version__.split('+')[0]}"
    path = Path(base) / tag / EXTENSION
    path.mkdir(parents=True, exist_ok=True)
    return path


def kernels(progress: Callable[[str], None] = log.info) -> Any:
    """The compiled kernel module, building it on first use; None (see `failure()`) if it can't."""
    global _kernels, _failure
    with _lock:
        if _kernels is not None or _failure is not None:
            return _kernels
        supported, why = cpu_supported()
        if not supported:
            _failure = why
            return None
        from torch.utils import cpp_extension

        _put_venv_ninja_on_path()
        directory = build_directory()
        built = any(directory.glob(f"{EXTENSION}*.so"))
        if not built:
            progress("  compiling the block-quant kernels (once per machine, about 1-2 minutes)...")
        started = time.perf_counter()
        try:
            _kernels = cpp_extension.load(
                EXTENSION,
                [str(SOURCE)],
                extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c"],
                build_directory=str(directory),
                verbose=False,
            )
        except Exception as error:  # no compiler, no ninja, a failed build: fall back, say why
            _failure = f"the kernels did not build: {str(error).strip().splitlines()[-1][:200]}"
            log.warning("block-quant kernels unavailable: %s", _failure)
            return None
        if not built:
            progress(f"  kernels compiled in {time.perf_counter() - started:.0f} s")
        return _kernels


def _put_venv_ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH; the pinned one lives beside this interpreter,
    which is not on PATH when the venv's python is run without activating the venv."""
    here = str(Path(sys.executable).parent)
    if shutil.which("ninja") is None and (Path(here) / "ninja").exists():
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")


def failure() -> str | None:
    return _failure


class BlockQuantLinear(nn.Module):
    """A bias-free linear over Q4_1 (`d * q + m`) or Q8_0 (`d * q`) blocks of 32 inputs.

    Buffers: `qs` (Q4_1: uint8 [out, in / 2], two weights a byte as GGUF packs them; Q8_0: int8
    [out, in]), `d` and, for Q4_1, `m` (float32 [out, in / 32]).
    """

    def __init__(
        self,
        kind: str,
        in_features: int,
        out_features: int,
        qs: torch.Tensor,
        d: torch.Tensor,
        m: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        # With int8 activations (Q8_1 per block of 32, as llama.cpp computes) a block's dot
        # product is integer maddubs/madd: about half the kernel time, at a relative error of
        # about 5e-3 per matmul. Off by default: see docs/engine.md for the quality figures.
        self.int8_activations = False
        if kind not in ("q4_1", "q8_0"):
            raise ValueError(f"unknown block kind {kind!r}")
        self.kind = kind
        self.in_features = in_features
        self.out_features = out_features
        self._kernels = kernels()
        if self._kernels is None:
            raise RuntimeError(f"block-quant kernels unavailable: {failure()}")
        self.register_buffer("qs", qs.contiguous())
        self.register_buffer("d", d.float().contiguous())
        self.register_buffer("m", (m if m is not None else torch.zeros(0)).float().contiguous())

    @classmethod
    def q4_1(cls, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> BlockQuantLinear:
        """From 4-bit values `q` [out, in] (0..15) with `w = q * d + m` per block [out, in / 32]."""
        out_features, in_features = q.shape
        blocks = q.to(torch.uint8).reshape(out_features, in_features // GROUP, GROUP)
        packed = blocks[..., :16] | (blocks[..., 16:] << 4)  # GGUF's order: j and j + 16
        return cls("q4_1", in_features, out_features, packed.reshape(out_features, -1), d, m)

    @classmethod
    def q8_0(cls, q: torch.Tensor, d: torch.Tensor) -> BlockQuantLinear:
        """From int8 values `q` [out, in] with `w = q * d` per block [out, in / 32]."""
        out_features, in_features = q.shape
        return cls("q8_0", in_features, out_features, q.to(torch.int8), d)

    def weight_float(self) -> torch.Tensor:
        """The float32 weight [out, in] the blocks stand for."""
        blocks = self.qs.reshape(self.out_features, self.in_features // GROUP, -1)
        if self.kind == "q4_1":
            nibbles = blocks.to(torch.int32)
            q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).float()
            weight = q * self.d[..., None] + self.m[..., None]
        else:
            weight = blocks.float() * self.d[..., None]
        return weight.reshape(self.out_features, self.in_features)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.reshape(-1, self.in_features)
        if rows.dtype != torch.float32:
            rows = rows.float()
        if rows.shape[0] > MAX_KERNEL_ROWS:
            out = torch.nn.functional.linear(rows, self.weight_float())
        elif self.kind == "q4_1":
            mm = self._kernels.q4_1_mm_q8 if self.int8_activations else self._kernels.q4_1_mm
            out = mm(rows.contiguous(), self.qs, self.d, self.m)
        else:
            mm = self._kernels.q8_0_mm_q8 if self.int8_activations else self._kernels.q8_0_mm
            out = mm(rows.contiguous(), self.qs, self.d)
        if out.dtype != hidden.dtype:
            out = out.to(hidden.dtype)
        return out.reshape(*hidden.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        activations = "int8" if self.int8_activations else "fp32"
        return f"{self.kind}, activations {activations}, in_features={self.in_features}, out_features={self.out_features}"


def q8_0_parts(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [out, in], d [out, in / 32]) with w ~ q * d: Q8_0's absmax per block."""
    w = weight.detach().float()
    out_features, in_features = w.shape
    blocks = w.reshape(out_features, in_features // GROUP, GROUP)
    d = (blocks.abs().amax(dim=-1) / 127).clamp(min=1e-12)
    q = torch.round(blocks / d[..., None]).clamp(-127, 127).to(torch.int8)
    return q.reshape(out_features, in_features), d
