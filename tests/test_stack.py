"""The process's one scheduler stack (chat/engine/stack.py): which base scheduler a backend gets,
and the sharing put in front of it, as StackConfig says. The sharing itself is
test_coalescing.py's and test_coalescing_across.py's; here, only how the stack is composed."""

from __future__ import annotations

import pytest

from chat.engine.local.scheduler import ContinuousScheduler
from chat.engine.remote.concurrent import ConcurrentScheduler
from chat.engine.remote.global_queue import RedisAdmission
from chat.engine.sharing.coalescing import SharingScheduler
from chat.engine.sharing.coalescing_across import AcrossProcesses
from chat.engine.stack import SchedulerStack, StackConfig, build_stack
from chat.engine.types import SteppedBackend
from harness.scripted import ScriptedBackend

pytestmark = pytest.mark.unit

UNREACHABLE = "redis://127.0.0.1:9/0"


class _EmptyBatch:
    def __len__(self) -> int:
        return 0


class SteppedScript(ScriptedBackend):
    """A scripted backend that says it steps its own model, so the stack batches it."""

    def new_batch(self):
        return _EmptyBatch()

    def row(self, request, on_text):
        raise NotImplementedError

    def result(self, row, started, finished):
        raise NotImplementedError

    def kv_bytes_per_token(self) -> int:
        return 1


@pytest.fixture
def stacks():
    built: list[SchedulerStack] = []
    yield built
    for stack in built:
        stack.close()


def test_a_model_stepped_in_process_gets_continuous_batching(stacks):
    backend = SteppedScript([])
    assert isinstance(backend, SteppedBackend)
    stack = build_stack(backend, StackConfig(max_waiting=5, max_batch=3, kv_budget_bytes=1024))
    stacks.append(stack)
    assert isinstance(stack.base, ContinuousScheduler)
    assert (stack.base.max_waiting, stack.base.max_batch, stack.base.kv_budget_bytes) == (
        5,
        3,
        1024,
    )


def test_a_server_gets_concurrent_streams_per_process_unless_a_global_queue_is_asked(stacks):
    alone = build_stack(ScriptedBackend([]), StackConfig(max_running=2, max_waiting=7))
    stacks.append(alone)
    assert isinstance(alone.base, ConcurrentScheduler)
    assert (alone.base.max_running, alone.base.max_waiting) == (2, 7)
    assert alone.base._admission is None

    shared = build_stack(
        ScriptedBackend([]),
        StackConfig(global_queue_url=UNREACHABLE, global_capacity=4, global_lease_seconds=3.0),
    )
    stacks.append(shared)
    admission = shared.base._admission
    assert isinstance(admission, RedisAdmission)
    assert admission.capacity == 4 and admission.lease_ms == 3000

    with pytest.raises(ValueError, match="global_queue_url"):
        build_stack(ScriptedBackend([]), StackConfig(global_capacity=4))


def test_sharing_sits_on_top_and_reaches_across_processes_only_when_asked(stacks):
    local = build_stack(ScriptedBackend([]), StackConfig())
    stacks.append(local)
    assert local.sharing.across is None
    # An answer that may not be shared gets the base scheduler itself; one that may, a view
    # through the process's Coalescer onto that same base.
    assert local.for_answer(None) is local.base
    view = local.for_answer("identity")
    assert isinstance(view, SharingScheduler) and view._scheduler is local.base

    across = build_stack(
        ScriptedBackend([]), StackConfig(share_across=lambda: UNREACHABLE, share_lease_seconds=4.0)
    )
    stacks.append(across)
    assert isinstance(across.sharing.across, AcrossProcesses)
    assert across.sharing.across.lease_seconds == 4.0
    assert across.sharing.across.url() == UNREACHABLE
