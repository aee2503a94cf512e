"""Freed memory goes back to the system after a big row leaves or the batch empties (heap.py)."""

from __future__ import annotations

import pytest

from chat.engine.local import heap
from chat.engine.local.heap import HeapTrimmer

DOCUMENT = [{"role": "user", "content": "Summarise this: " + "the lighthouse keeper " * 400}]
SHORT = [{"role": "user", "content": "Say hi."}]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def recording() -> tuple[HeapTrimmer, list[int], Clock]:
    calls: list[int] = []
    clock = Clock()
    trimmer = HeapTrimmer(trim=lambda pad: calls.append(pad) or 1, clock=clock)
    return trimmer, calls, clock


@pytest.mark.unit
def test_an_idle_moment_trims_only_after_enough_rows_ended():
    trimmer, calls, _ = recording()
    trimmer.ended(100)
    trimmer.idle()
    assert calls == []  # a few short answers are not worth walking the arenas
    trimmer.ended(heap.IDLE_TRIM_TOKENS)
    trimmer.idle()
    trimmer.idle()
    assert calls == [0]  # once: the count starts again after a trim


@pytest.mark.unit
def test_a_long_row_trims_at_once_but_not_more_often_than_the_busy_interval():
    trimmer, calls, clock = recording()
    trimmer.ended(heap.LONG_ROW_TOKENS)
    assert calls == [0]
    clock.now += heap.BUSY_INTERVAL_S / 2
    trimmer.ended(heap.LONG_ROW_TOKENS)
    assert calls == [0]
    trimmer.idle()  # ...but the batch emptying afterwards still gives it back
    assert calls == [0, 0]
    clock.now += heap.BUSY_INTERVAL_S
    trimmer.ended(heap.LONG_ROW_TOKENS)
    assert calls == [0, 0, 0]


@pytest.mark.unit
def test_glibc_trim_is_found_here():
    """The machines this runs on have glibc: the trimmer must not silently be a no-op there."""
    assert HeapTrimmer().available
    HeapTrimmer().trim()  # and calling it works


@pytest.mark.integration
def test_a_document_leaving_the_real_batch_trims_the_heap_and_a_short_answer_does_not(
    backend, monkeypatch
):
    monkeypatch.setattr(heap, "IDLE_TRIM_TOKENS", 1024)  # a document of 1,200 tokens reads fast
    trimmer, calls, _ = recording()
    batch = backend.new_batch()
    batch.heap = trimmer
    short = backend.row(backend.request(SHORT, max_new_tokens=2), lambda text: None)
    batch.add([short])
    while batch.rows or batch.pending:
        batch.step()
    assert calls == []

    request = backend.request(DOCUMENT, max_new_tokens=2)
    assert len(request.input_ids) >= heap.IDLE_TRIM_TOKENS
    batch.add([backend.row(request, lambda text: None)])
    while batch.rows or batch.pending:
        batch.step()
    assert calls == [0]


@pytest.mark.integration
def test_a_document_cancelled_mid_prefill_is_counted(backend, monkeypatch):
    monkeypatch.setattr(heap, "IDLE_TRIM_TOKENS", 1024)
    trimmer, calls, _ = recording()
    batch = backend.new_batch()
    batch.heap = trimmer
    batch.store = None  # an earlier test's document would be reused, not read in chunks
    batch.prefill_chunk = 64
    request = backend.request(DOCUMENT, max_new_tokens=2)
    batch.add([backend.row(request, lambda text: None)])
    assert batch.pending
    batch.step()
    request.cancel.set()
    batch.drop_cancelled()
    assert not batch.pending
    assert calls == [0]


@pytest.mark.integration
def test_the_backend_gives_its_batches_its_trimmer(backend):
    assert backend.new_batch().heap is backend.heap


@pytest.mark.integration
def test_a_torch_free_web_tier_gives_its_start_ups_freed_heap_back_once(
    settings, monkeypatch, backend
):
    """With CHAT_BACKEND=openai the runtime trims once the backend is ready (a local model's
    backend trims its own once loaded): 142 -> 126 MB resident after a relay's start."""
    from chat.infra import runtime as runtime_module
    from harness.openai_server import FakeOpenAIServer
    from tests.test_remote import remote_for

    trims: list[str] = []

    class Recorded(HeapTrimmer):
        def trim(self) -> None:
            trims.append(settings.CHAT_BACKEND)

    monkeypatch.setattr(runtime_module, "HeapTrimmer", Recorded)
    server = FakeOpenAIServer(backend).start()
    try:
        for kind in ("openai", "local"):
            settings.CHAT_BACKEND = kind
            fresh = runtime_module.Runtime()
            monkeypatch.setattr(fresh, "_make_backend", lambda: remote_for(server, backend))
            monkeypatch.setattr(fresh, "_load_engine_rows", lambda: None)
            fresh._load()
            assert fresh.state == "ready", fresh.detail
    finally:
        server.stop()
    assert trims == ["openai"]
