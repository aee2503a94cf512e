"""How many torch threads a forward pass gets: every core for a prefill, one fewer for decode.

A decode step is a few hundred small operators, each of which, when torch runs it on several
threads, starts a parallel region: the sleeping OpenMP workers are woken (they sleep between
regions: OMP_WAIT_POLICY=PASSIVE, chat/engine/__init__.py) and the step waits for the slowest
of them, however briefly the web tier, a streamer or another process held its core. A prefill
is a few large matmuls, where more threads pay. Measured on a 2-core EPYC (docs/engine.md, "How
many threads"): a one-row step took 19-22 ms on 1 thread and 26-31 ms on 2 with the machine
otherwise idle; over `/v1` on a live daphne one stream gave 40 tok/s against 29, and 8 users
96-100 tok/s against 90-94, while a 256-token prefill matmul took twice as long on 1 thread.

So a forward pass of more than DECODE_TOKENS tokens (a prefill chunk, what the block kernels
hand to the float GEMM) runs on every thread torch was given, and a decode step on one thread
fewer (at least one): the core left over serves the event loop and the streaming. Switching
costs about 0.2 ms, paid only when a prefill and decode steps alternate.
"""

from __future__ import annotations

import torch

# A forward pass of at most this many tokens is a decode step (the block kernels' own limit).
DECODE_TOKENS = 16
# torch's own default (the cores it may use), read before anything here changes it.
TORCH_DEFAULT = torch.get_num_threads()


class ThreadPlan:
    """Sets torch's intra-op threads for each forward pass by its size (one worker drives it)."""

    def __init__(self, prefill: int, decode: int):
        self.prefill = max(1, prefill)
        self.decode = max(1, decode)

    @classmethod
    def configured(cls, threads: int = 0, decode: int = 0) -> ThreadPlan:
        """Prefill on `threads` (0: torch's default); decode on `decode` (0: one fewer)."""
        prefill = threads or TORCH_DEFAULT
        return cls(prefill, decode or prefill - 1)

    @property
    def step_helpers(self) -> int:
        """Threads beside the engine's own that share a fused decode step's work (llama_step.py):
        one per core beyond the first, which it claims a chunk at a time, so a helper held off
        its core by the event loop delays nothing but the chunk it took."""
        return self.prefill - 1

    def use(self, tokens: int) -> None:
        """Before a forward pass over `tokens` ids (rows x columns)."""
        wanted = self.decode if tokens <= DECODE_TOKENS else self.prefill
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)

    def describe(self) -> str:
        return f"{self.prefill} thread(s) for a prefill, {self.decode} for a decode step"
