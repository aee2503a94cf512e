"""One chat turn, start to end: policy -> prompt -> cache -> queue -> engine -> gate -> store.

Every transport calls `admit` and forwards the typed events (chat/protocol/events.py) it is
handed; none touches the model or the database itself. The modules, in a turn's order:

- admit.py: the check-and-start sequence (rate checks, readiness, prepare, cache or queue).
- prepare.py, continuation.py: a new prompt's or a Continue's stored messages and model input.
- run.py: the engine's events through the policy gate; re-asks. finish.py: the answer stored,
  `done` sent, counted and cached (or the failure stored).
- handle.py: the `Turn` a transport holds (cancel, detach, attach); its listeners and grace period.
- journal.py, resume.py: a running answer's numbered events; a client coming back for them.
- running.py, cancel_bus.py: the turns running here; drain at shutdown; cancel from any process,
  one answer or every answer of a revoked API key.
- forgetting.py: what a deleted conversation left in the engine (prefix KV, shared generations'
  events), filed under its tag and forgotten in every process.
- prompting.py, limits.py: the chat fitted to the model's context; the per-minute rate checks.
- budget.py: token and answer budgets, checked at admission and charged as an answer ends.
- refusals.py: TurnError. The events a turn emits and the table of error codes are the wire
  contract, in chat/protocol/ (events.py, errors.py).
"""

from .admit import admit
from .cancel_bus import CancelAnswer
from .handle import Turn
from .limits import socket_resume_limiter, turn_rate_check
from .prepare import Given
from .refusals import TurnError
from .resume import Following, turn_resume
from .running import (
    api_keys_stop,
    cancel_bus,
    conversations_forget,
    running_turns,
    turn_cancel,
    turns_drain,
)

__all__ = [
    "CancelAnswer",
    "Following",
    "Given",
    "Turn",
    "TurnError",
    "admit",
    "api_keys_stop",
    "cancel_bus",
    "conversations_forget",
    "running_turns",
    "socket_resume_limiter",
    "turn_cancel",
    "turn_rate_check",
    "turn_resume",
    "turns_drain",
]
