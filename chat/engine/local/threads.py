"""How many threads a forward pass gets: every core for a prefill and for a fused decode step,
one fewer for a decode step through transformers' forward.

Through transformers' forward a decode step is a few hundred small operators, each of which,
when torch runs it on several threads, starts a parallel region: the sleeping OpenMP workers are
woken (they sleep between regions: OMP_WAIT_POLICY=PASSIVE, project/settings.py) and the
step waits for the slowest of them, however briefly the web tier, a streamer or another process
held its core. So such a step runs on one thread fewer (at least one), the core left over
serving the event loop, while a prefill (a few large matmuls, more than DECODE_TOKENS tokens)
runs on every thread torch was given. Switching costs about 0.2 ms, paid only when a prefill and
decode steps alternate.

The fused decode step (llama_step.py) has no such regions: its own thread and `step_helpers`
helpers, one per further core, claim its matmuls' chunks one at a time, so a helper held off its
core delays only the chunk it took. On the 2-core EPYC (docs/engine.md, "The fused decode
step"), one stream over `/v1` went from 68-80 tok/s on one thread to 95-113 with a helper.
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
        return (
            f"{self.prefill} thread(s) for a prefill and a fused decode step, "
            f"{self.decode} for transformers' decode step"
        )
