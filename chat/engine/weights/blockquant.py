"""Linears that read GGUF's own blocks (Q4_1 projections, a Q8_0 LM head) through C++ kernels.

A decode step of a small model reads every weight once, so its speed is set by the bytes the
weights take: 538 MB a token in fp32, about 95 MB as the bundled GGUF stores them (Q4_1
projections, 20 bytes per 32 weights; a Q8_0 embedding/LM head, 34 bytes per 32). torch's own
weight-only kernels are vectorized for AVX-512 only (quantized.py measured them 2.6x to 5x
slower than fp32 on an AVX2 CPU), so this module compiles small C++ kernels
(kernels/blockquant.cpp) with torch's extension builder, once per machine, and keeps the
weights exactly as the file stores them: the matmuls llama.cpp computes, with fp32 activations
(`gguf`) or, like llama.cpp, int8 ones (`gguf-q8`).

The kernels are compiled for the best instruction set /proc/cpuinfo allows, AVX-512 (F, BW, VL,
DQ, and VNNI for the int8 path where present) or AVX2 + FMA (`isa_level`); the build directory
and module name carry that level, so machines sharing a home directory never load each other's
build, and the module's `isa()` says which was compiled.

Rows beyond MAX_KERNEL_ROWS (a document's prefill chunk) are computed by dequantizing the
layer's weight into a scratch matrix and calling the float GEMM, whose blocking wins there.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import widening

# The GGML block types and their layouts, re-exported: callers name them as blockquant's.
from .block_types import GGML_Q4_1 as GGML_Q4_1
from .block_types import GGML_Q8_0 as GGML_Q8_0
from .block_types import GROUP as GROUP
from .block_types import KIND_OF_TYPE as KIND_OF_TYPE
from .block_types import Q4_1_BLOCK_BYTES as Q4_1_BLOCK_BYTES
from .block_types import Q8_0_BLOCK_BYTES as Q8_0_BLOCK_BYTES
from .block_types import RAW_KINDS as RAW_KINDS
from .block_types import SPLIT_KINDS as SPLIT_KINDS
from .block_types import WIDENED_AS as WIDENED_AS

log = logging.getLogger(__name__)

KERNELS = Path(__file__).with_name("kernels")
# The extension's sources: the block matmuls, and the decode step built on them (llama_step.py).
SOURCES = (
    KERNELS / "blockquant.cpp",
    KERNELS / "rawblocks.cpp",
    KERNELS / "rawblocks_avx512.cpp",
    KERNELS / "llama_step.cpp",
)
# Bump when the C++ interface changes, so an old build is never imported.
EXTENSION = "chat_blockquant_v8"
# The AVX-512 subsets the AVX-512 kernels are compiled for (cpuinfo names; -mavx512f and so on).
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
ISA_LEVELS = ("avx2", "avx512", "avx512-vnni")
# Up to this many rows (a chat prompt, a 128-token prefill chunk) the kernels beat dequantizing
# the weight and torch's GEMM: 3-4x at 32 rows, even at 128; above it the GEMM's blocking wins
# (bench/scripts/block_kernel_timing.py --dequantized, docs/engine.md).
MAX_KERNEL_ROWS = 128

_lock = threading.Lock()
_kernels: Any = None
_failure: str | None = None


def cpu_flags() -> list[str]:
    """The first CPU's feature flags from /proc/cpuinfo; empty where it cannot be read."""
    try:
        return Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        return []


def cpu_supported() -> tuple[bool, str]:
    """Whether this CPU runs the kernels (x86-64 with AVX2 and FMA)."""
    flags = cpu_flags()
    if not flags:
        return False, "cannot read /proc/cpuinfo"
    missing = [flag for flag in ("avx2", "fma", "f16c") if flag not in flags]
    if missing:
        return False, f"this CPU lacks {', '.join(missing)}"
    return True, ""


def isa_level(flags: list[str] | None = None, wanted: str = "") -> str:
    """The kernels' instruction set for this CPU: "avx512-vnni", "avx512" or "avx2".

    `wanted="avx2"` names the AVX2 kernels on an AVX-512 CPU (to test or time them, with
    `build`); it cannot raise the level above what the CPU has.
    """
    flags = cpu_flags() if flags is None else flags
    level = "avx2"
    if all(flag in flags for flag in AVX512_FLAGS):
        level = "avx512-vnni" if "avx512_vnni" in flags else "avx512"
    if wanted and wanted not in ISA_LEVELS:
        raise ValueError(f"isa {wanted!r}: expected one of {', '.join(ISA_LEVELS)}")
    if wanted and ISA_LEVELS.index(wanted) < ISA_LEVELS.index(level):
        return wanted
    return level


def compiler_flags(level: str) -> list[str]:
    flags = ["-O3", "-fopenmp", "-mavx2", "-mfma", "-mf16c"]
    if level.startswith("avx512"):
        flags += [f"-m{flag.replace('_', '')}" for flag in AVX512_FLAGS]
    if level == "avx512-vnni":
        flags.append("-mavx512vnni")
    return flags


def build_directory(level: str | None = None) -> Path:
    """Where the compiled kernels are kept: one build per instruction set, torch version and
    checkout, so two CPUs sharing a home directory never load each other's build, and two
    checkouts on one machine never rebuild over each other (the build names its sources' paths:
    a build for another checkout's sources is a rebuild)."""
    base = Path.home() / ".cache" / "chat-kernels"
    tag = f"torch-{torch.__version__.split('+')[0]}"
    checkout = hashlib.sha256(str(KERNELS.resolve()).encode()).hexdigest()[:8]
    path = Path(base) / tag / f"{EXTENSION}-{level or isa_level()}-{checkout}"
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
        try:
            _kernels = build(isa_level(), progress)
        except Exception as error:  # no compiler, no ninja, a failed build: fall back, say why
            _failure = f"the kernels did not build: {str(error).strip().splitlines()[-1][:200]}"
            log.warning("block-quant kernels unavailable: %s", _failure)
            return None
        return _kernels


def build(level: str, progress: Callable[[str], None] = log.info) -> Any:
    """Compile (or load the build of) the kernels for one instruction set; raises if it fails."""
    from torch.utils import cpp_extension

    name = f"{EXTENSION}_{level.replace('-', '_')}"
    directory = build_directory(level)
    built = any(directory.glob(f"{name}*.so"))
    if not built:
        progress(
            f"  compiling the block-quant kernels for {level} (once per machine and checkout, 1-2 minutes)..."
        )
    started = time.perf_counter()
    with _build_guard(directory):
        module = cpp_extension.load(
            name,
            [str(source) for source in SOURCES],
            extra_cflags=compiler_flags(level),
            # at::parallel_for is inline: without OpenMP it runs serially whatever torch's thread
            # count. libgomp is the runtime torch itself loads (one soname, one thread pool).
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=False,
        )
    if not built:
        progress(f"  kernels compiled in {time.perf_counter() - started:.0f} s")
    return module


@contextmanager
def _build_guard(directory: Path) -> Iterator[None]:
    """One build at a time in `directory`, under a lock the system drops with its process.

    torch's builder takes a lock file of its own (FileBaton: `lock`, waited on while it exists)
    that a process killed mid-build leaves behind, and every later start then waits on it for
    ever. Under this flock no other start is building here, so a `lock` file found is such a
    leftover, and goes."""
    with open(directory / "build.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            leftover = directory / "lock"
            if leftover.exists():
                log.warning("removing %s, left by a kernel build that did not finish", leftover)
                leftover.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


def failure() -> str | None:
    return _failure


class BlockQuantLinear(nn.Module):
    """A linear over GGUF blocks: Q4_1 (`d * q + m`) or Q8_0 (`d * q`) in a split layout, or a
    file's rows of Q4_0, Q5_1 or Q5_K as stored (`RAW_KINDS`; `from_gguf` widens a file's Q5_0,
    Q4_K and Q6_K rows to the Q8_0 and Q4_1 layouts, the same weights).

    Buffers: `qs` (Q4_1: uint8 [out, in / 2], two weights a byte as GGUF packs them; Q8_0: int8
    [out, in]; a raw kind: uint8 [out, row bytes], the file's row), `d` and, for Q4_1, `m`
    (float32 [out, in / 32], or for a widened Q6_K's Q8_0 [out, in / 16]: a scale per 16
    weights; empty for a raw kind), and `bias` (float32 [out], or None: Qwen2's q/k/v have one).
    """

    def __init__(
        self,
        kind: str,
        in_features: int,
        out_features: int,
        qs: torch.Tensor,
        d: torch.Tensor | None = None,
        m: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        # With int8 activations (Q8_1 per block of 32, as llama.cpp computes) a block's dot
        # product is integer maddubs/madd: about half the kernel time, at a relative error of
        # about 5e-3 per matmul. Off by default: see docs/engine.md for the quality figures.
        # The raw kinds always compute with fp32 activations.
        self.int8_activations = False
        if kind not in SPLIT_KINDS and kind not in RAW_KINDS:
            raise ValueError(f"unknown block kind {kind!r}")
        self.kind = kind
        self.ggml_type, block_weights, block_bytes = {**SPLIT_KINDS, **RAW_KINDS}[kind]
        if in_features % block_weights:
            raise ValueError(
                f"{kind}: in_features {in_features} is not a multiple of {block_weights}"
            )
        self.in_features = in_features
        self.out_features = out_features
        self._kernels = kernels()
        if self._kernels is None:
            raise RuntimeError(f"block-quant kernels unavailable: {failure()}")
        if kind in RAW_KINDS and tuple(qs.shape) != (
            out_features,
            in_features // block_weights * block_bytes,
        ):
            raise ValueError(
                f"{kind}: blocks of shape {tuple(qs.shape)} do not fit {out_features}x{in_features}"
            )
        scales = [in_features // GROUP] + ([in_features // 16] if kind == "q8_0" else [])
        if kind in SPLIT_KINDS and (
            d is None or d.dim() != 2 or d.shape[0] != out_features or d.shape[1] not in scales
        ):
            raise ValueError(
                f"{kind}: scales of shape {None if d is None else tuple(d.shape)} do not fit "
                f"{out_features}x{in_features}"
            )
        self.register_buffer("qs", qs.contiguous())
        self.register_buffer("d", (d if d is not None else torch.zeros(0)).float().contiguous())
        self.register_buffer("m", (m if m is not None else torch.zeros(0)).float().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

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

    @classmethod
    def from_gguf(
        cls, ggml_type: int, rows: torch.Tensor, in_features: int, bias: torch.Tensor | None = None
    ) -> BlockQuantLinear:
        """From a GGUF tensor's rows as the file stores them (uint8 [out, row bytes]) of any type
        in `KIND_OF_TYPE`; Q4_1 and Q8_0 are split into their kernels' layout, Q5_0, Q4_K and
        Q6_K widened into Q8_0's, Q4_1's and Q8_0's with 16-weight scales (`WIDENED_AS`)."""
        kind = KIND_OF_TYPE.get(ggml_type)
        if kind is None:
            raise ValueError(f"GGML type {ggml_type} has no block kernel")
        rows = rows.contiguous().view(torch.uint8)
        out_features = rows.shape[0]
        if kind in WIDENED_AS:
            qs, d, m = widening.WIDEN[kind](rows, in_features)
            return cls(WIDENED_AS[kind], in_features, out_features, qs, d, m, bias=bias)
        if kind in RAW_KINDS:
            return cls(kind, in_features, out_features, rows, bias=bias)
        block_bytes = SPLIT_KINDS[kind][2]
        if in_features % GROUP or rows.shape[1] != in_features // GROUP * block_bytes:
            raise ValueError(
                f"{kind}: rows of {rows.shape[1]} bytes do not fit {in_features} inputs"
            )
        blocks = rows.reshape(out_features, in_features // GROUP, block_bytes)
        d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
        if kind == "q4_1":
            m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()
            qs = blocks[..., 4:].reshape(out_features, -1)
            return cls("q4_1", in_features, out_features, qs, d, m, bias=bias)
        qs = blocks[..., 2:].contiguous().view(torch.int8).reshape(out_features, in_features)
        return cls("q8_0", in_features, out_features, qs, d, bias=bias)

    def weight_float(self) -> torch.Tensor:
        """The float32 weight [out, in] the blocks stand for."""
        if self.kind in RAW_KINDS:
            return self._kernels.raw_dequantize(self.qs, self.ggml_type, self.in_features)
        blocks = self.qs.reshape(self.out_features, self.in_features // GROUP, -1)
        if self.kind == "q4_1":
            nibbles = blocks.to(torch.int32)
            q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).float()
            weight = q * self.d[..., None] + self.m[..., None]
        else:  # a scale per 32 weights, or per 16 (a widened Q6_K)
            blocks = self.qs.reshape(self.out_features, self.d.shape[1], -1)
            weight = blocks.float() * self.d[..., None]
        return weight.reshape(self.out_features, self.in_features)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.reshape(-1, self.in_features)
        if rows.dtype != torch.float32:
            rows = rows.float()
        if rows.shape[0] > MAX_KERNEL_ROWS:
            out = torch.nn.functional.linear(rows, self.weight_float())
        elif self.kind == "q4_1":
            out = self._kernels.q4_1_mm(
                rows.contiguous(), self.qs, self.d, self.m, self.int8_activations
            )
        elif self.kind == "q8_0":
            out = self._kernels.q8_0_mm(rows.contiguous(), self.qs, self.d, self.int8_activations)
        else:
            out = self._kernels.raw_mm(rows.contiguous(), self.qs, self.ggml_type)
        if self.bias is not None:
            out = out + self.bias
        if out.dtype != hidden.dtype:
            out = out.to(hidden.dtype)
        return out.reshape(*hidden.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        activations = "int8" if self.int8_activations and self.kind in SPLIT_KINDS else "fp32"
        return (
            f"{self.kind}, activations {activations}, in_features={self.in_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )


def q8_0_parts(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [out, in], d [out, in / 32]) with w ~ q * d: Q8_0's absmax per block."""
    w = weight.detach().float()
    out_features, in_features = w.shape
    blocks = w.reshape(out_features, in_features // GROUP, GROUP)
    d = (blocks.abs().amax(dim=-1) / 127).clamp(min=1e-12)
    q = torch.round(blocks / d[..., None]).clamp(-127, 127).to(torch.int8)
    return q.reshape(out_features, in_features), d
