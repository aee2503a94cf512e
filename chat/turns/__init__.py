"""One chat turn, start to end: policy -> prompt -> cache -> queue -> engine -> gate -> store.

Every transport calls `admit` and forwards the typed events (chat/protocol/events.py) it is
handed; none touches the model or the database itself. The modules, in a turn's order:

- admit.py: the check-and-start sequence (rate checks, readiness, prepare, cache or queue).
- prepare.py, continuation.py: a new prompt's or a Continue's stored messages and model input.
- run.py: the engine's events through the policy gate; re-asks; the answer stored and cached.
- handle.py: the `Turn` a transport holds (cancel, detach, attach); its listeners and grace period.
- journal.py, resume.py: a running answer's numbered events; a client coming back for them.
- running.py, cancel_bus.py: the turns running here; drain at shutdown; cancel from any process.
- prompting.py, limits.py: the chat fitted to the model's context; the per-minute rate checks.
- errors.py: TurnError. The events a turn emits and the table of error codes are the wire
  contract, in chat/protocol/ (events.py, errors.py).
"""

from .admit import admit
from .errors import TurnError
from .handle import Turn
from .limits import turn_rate_check
from .prepare import Given
from .resume import Following, turn_resume
from .running import cancel_bus, running_turns, turn_cancel, turns_drain

__all__ = [
    "Following",
    "Given",
    "Turn",
    "TurnError",
    "admit",
    "cancel_bus",
    "running_turns",
    "turn_cancel",
    "turn_rate_check",
    "turn_resume",
    "turns_drain",
]
