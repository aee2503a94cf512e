"""The process's one scheduler stack, composed in one place (`build_stack`).

From the backend up, each layer in front of the one below it:

1. The base scheduler runs requests on the backend. A backend that steps its own model here
   (a SteppedBackend) gets `local.scheduler.ContinuousScheduler` (continuous batching); any
   other, an inference server, gets `remote.concurrent.ConcurrentScheduler` (one stream per
   slot, FIFO beyond), whose slots and queue `remote.global_queue` shares with every process
   on one Redis when `global_capacity` is set.
2. Sharing across processes (`sharing.coalescing_across.AcrossProcesses`, when `share_across`
   names a Redis): the one request a process's identical answers share either claims the
   generation in Redis and runs on the base scheduler, or follows the process that runs it.
3. Sharing in this process (`sharing.coalescing.Coalescer`): identical cacheable requests in
   flight fold into that one request.

A turn asks `SchedulerStack.for_answer(key)` with its answer's identity when the answer may be
shared, None when it may not (sampled without a seed, a regeneration, a policy that caches
nothing): that turn gets the base scheduler itself. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .local.scheduler import ContinuousScheduler
from .remote.concurrent import ConcurrentScheduler
from .remote.global_queue import RedisAdmission
from .sharing.coalescing import Coalescer
from .sharing.coalescing_across import AcrossProcesses
from .types import Backend, Scheduler, SteppedBackend


@dataclass(frozen=True)
class StackConfig:
    """How the stack is built, as plain data (the runtime reads it from the settings).

    Args:
        max_waiting: requests queued beyond those running; more are refused with QueueFull.
        max_batch: rows the local model decodes at once.
        kv_budget_bytes: the local batch's KV cache, at most; None: no bound.
        max_running: streams open at once to an inference server, per process.
        global_queue_url: the Redis of the inference server's queue shared by every process.
        global_capacity: streams open at once to the server from all processes; 0: per process.
        global_lease_seconds: how long a process holding a global slot may go unheard.
        share_across: the Redis URL on which processes share generations, read at each request
            (settings may change it; tests do); None: sharing stays within this process.
        share_lease_seconds: how long an owner or follower of a shared generation may go unheard.
    """

    max_waiting: int = 64
    max_batch: int = 1
    kv_budget_bytes: int | None = None
    max_running: int = 8
    global_queue_url: str | None = None
    global_capacity: int = 0
    global_lease_seconds: float = 10.0
    share_across: Callable[[], str] | None = None
    share_lease_seconds: float = 10.0


class SchedulerStack:
    """The base scheduler and the sharing in front of it (see the module doc).

    `base` runs the requests; `sharing` folds identical ones (its `joined` counts them, its
    `across` those that followed another process).
    """

    def __init__(self, base: Scheduler, sharing: Coalescer | None = None):
        self.base = base
        self.sharing = sharing if sharing is not None else Coalescer()

    def for_answer(self, key: str | None) -> Scheduler:
        """The scheduler a turn whose answer has identity `key` submits to: identical answers in
        flight share one generation. None shares nothing: the base scheduler itself."""
        return self.sharing.sharing(self.base, key)

    def expect(self) -> None:
        """Announce a request being prepared (its answer's identity not yet known)."""
        self.base.expect()

    def unexpect(self) -> None:
        """Withdraw an `expect` whose request will not be submitted."""
        self.base.unexpect()

    def close(self) -> None:
        self.base.close()


def build_stack(backend: Backend, config: StackConfig) -> SchedulerStack:
    """The stack for `backend`, built bottom up: base scheduler, then sharing (module doc)."""
    base: Scheduler
    if isinstance(backend, SteppedBackend):
        base = ContinuousScheduler(
            backend,
            max_waiting=config.max_waiting,
            max_batch=config.max_batch,
            kv_budget_bytes=config.kv_budget_bytes,
        )
    else:
        admission = None
        if config.global_capacity:
            if config.global_queue_url is None:
                raise ValueError(
                    "a global queue (global_capacity) needs its Redis: global_queue_url"
                )
            # One queue per server and model, whichever process joins it.
            admission = RedisAdmission(
                config.global_queue_url,
                backend.fingerprint[:16],
                capacity=config.global_capacity,
                lease_seconds=config.global_lease_seconds,
            )
        base = ConcurrentScheduler(
            backend,
            max_running=config.max_running,
            max_waiting=config.max_waiting,
            admission=admission,
        )
    # A listener that leaves a shared generation is charged the tokens of what it received.
    count_tokens = backend.token_count
    across = None
    if config.share_across is not None:
        across = AcrossProcesses(
            config.share_across,
            lease_seconds=config.share_lease_seconds,
            count_tokens=count_tokens,
        )
    return SchedulerStack(base, Coalescer(across=across, count_tokens=count_tokens))
