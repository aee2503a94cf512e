"""Chunked prefill on the real model: a long prompt joins running rows a chunk per decode step."""

from __future__ import annotations

import threading

import pytest
import torch

from chat.engine.local.decoding import RunningBatch
from chat.engine.local.scheduler import ContinuousScheduler
from chat.engine.types import Finished, Reading

pytestmark = pytest.mark.integration

STORY = [{"role": "user", "content": "Write a long story about a dragon."}]
# About 300 tokens: several chunks of 32.
LONG_PROMPT = [{"role": "user", "content": "Summarise this: " + "the lighthouse keeper " * 100}]
CHUNK = 32


def running_batch(backend, chunk: int = CHUNK):
    """A batch with one row decoding (forced long), ready for a newcomer."""
    batch = backend.new_batch()
    batch.prefill_chunk = chunk
    batch.store = None  # every chunk counted here is computed (test_prefix_reuse covers reuse)
    runner = backend.row(
        backend.request(STORY, max_new_tokens=200, min_new_tokens=200), lambda text: None
    )
    assert batch.add([runner]) == []
    batch.step()
    return batch, runner


def test_running_rows_keep_decoding_while_a_long_prompt_is_prefilled(backend):
    batch, runner = running_batch(backend)
    request = backend.request(LONG_PROMPT, max_new_tokens=4, min_new_tokens=4)
    chunks = -(-len(request.input_ids) // CHUNK)
    assert chunks >= 5
    newcomer = backend.row(request, lambda text: None)
    before = len(runner.new_ids)

    assert batch.add([newcomer]) == []  # pending: nothing computed for it yet
    assert batch.pending and len(batch) == 2
    steps = 0
    while not newcomer.new_ids:
        batch.step()
        steps += 1
    # One chunk per step, and the running row got a token on every one of those steps.
    assert steps == chunks
    assert len(runner.new_ids) - before == chunks
    assert not batch.pending and len(batch.rows) == 2
    while newcomer.reason is None:
        batch.step()
    assert newcomer.reason == "length" and len(newcomer.new_ids) == 4
    assert runner.reason is None  # still going: it never waited for the newcomer


def test_a_chunked_prefill_gives_the_logits_of_a_whole_one(backend):
    """The newcomer's first-token logits are those of a prefill in one pass (not its wording)."""
    request = backend.request(LONG_PROMPT, max_new_tokens=2)
    whole, chunked = {}, {}
    for box, chunk in ((whole, 0), (chunked, CHUNK)):
        batch, _ = running_batch(backend, chunk)
        join = batch._join
        batch._join = lambda prefill, logits, box=box, join=join: (
            box.setdefault("logits", logits[-1].clone()),
            join(prefill, logits),
        )[1]
        batch.add([backend.row(request, lambda text: None)])
        while "logits" not in box:
            batch.step()
    torch.testing.assert_close(chunked["logits"], whole["logits"], rtol=1e-3, atol=1e-3)


def test_a_newcomer_cancelled_mid_prefill_leaves_before_the_next_chunk(backend):
    batch, runner = running_batch(backend)
    request = backend.request(LONG_PROMPT, max_new_tokens=4)
    newcomer = backend.row(request, lambda text: None)
    batch.add([newcomer])
    batch.step()  # its first chunk
    calls = batch.forward_calls
    request.cancel.set()
    assert batch.drop_cancelled() == [newcomer]
    assert newcomer.reason == "cancelled" and not batch.pending and len(batch) == 1
    batch.step()
    assert batch.forward_calls == calls + 1  # the runner's decode step alone, no further chunk
    assert runner.reason is None


def lone_batch(backend, chunk: int = CHUNK):
    batch = backend.new_batch()
    batch.prefill_chunk = chunk
    batch.store = None
    return batch


def test_a_lone_prompt_of_a_few_chunks_is_prefilled_at_once(backend):
    """With nobody decoding there is nobody to protect: a prompt up to a chunk read alone starts
    in one pass."""
    batch = lone_batch(backend, chunk=len(backend.request(LONG_PROMPT).input_ids))
    row = backend.row(backend.request(LONG_PROMPT, max_new_tokens=2), lambda text: None)
    batch.add([row])
    assert not batch.pending and len(row.new_ids) == 1 and batch.forward_calls == 1


def test_a_lone_document_is_read_in_chunks_and_says_how_far(backend):
    """Longer than a chunk read alone (a pasted document): read a few chunks a step, each step
    reporting the tokens read, so the page can show progress and newcomers can join between."""
    batch = lone_batch(backend)
    request = backend.request(LONG_PROMPT, max_new_tokens=2)
    total = len(request.input_ids)
    alone = CHUNK * batch.CHUNK_ALONE_FACTOR
    assert total > alone
    row = backend.row(request, lambda text: None)
    reports: list[tuple[int, int]] = []
    row.on_reading = lambda read, of: reports.append((read, of))
    assert batch.add([row]) == [] and batch.pending
    while not row.new_ids:
        batch.step()
    steps = -(-total // alone)
    assert batch.forward_calls == steps + 1  # the last step decodes the row that joined, too
    assert reports == [(min(alone * (i + 1), total), total) for i in range(steps - 1)]


def test_a_newcomer_is_not_stuck_behind_a_document(backend):
    """A document is being read; a short prompt that arrives meanwhile gets its first token
    before the document's reading ends, and one longer than a chunk is read first (least left
    to read goes first)."""
    batch = lone_batch(backend, chunk=64)
    assert len(backend.request(STORY).input_ids) <= 64 < len(backend.request(LONG_PROMPT).input_ids)
    document = backend.row(
        backend.request(
            [{"role": "user", "content": "Summarise this: " + "the lighthouse keeper " * 400}],
            max_new_tokens=2,
        ),
        lambda text: None,
    )
    batch.add([document])
    batch.step()  # its first chunk
    short = backend.row(backend.request(STORY, max_new_tokens=4), lambda text: None)
    batch.add([short])
    assert short.new_ids and batch.pending  # joined at once, the document still being read
    longer = backend.row(backend.request(LONG_PROMPT, max_new_tokens=4), lambda text: None)
    batch.add([longer])
    while not longer.new_ids:
        batch.step()
    assert not document.new_ids  # the shorter newcomer went first
    while not document.new_ids:
        batch.step()
    assert short.new_ids and longer.new_ids


DOCUMENT = [{"role": "user", "content": "Summarise this: " + "the lighthouse keeper " * 200}]


def test_a_chunk_paused_between_layers_resumes_to_the_logits_of_a_whole_prefill(backend):
    """Paused at every few layers (for a newcomer that never comes), a document's chunks still
    give the first-token logits of one pass, and no chunk is read twice."""
    request = backend.request(DOCUMENT, max_new_tokens=2)
    whole, paused = {}, {}
    for box, chunk in ((whole, 0), (paused, CHUNK)):
        batch = lone_batch(backend, chunk)
        checks = iter(range(10**6))
        batch.pause_when = lambda checks=checks: next(checks) % 7 == 6
        join = batch._join
        batch._join = lambda prefill, logits, box=box, join=join: (
            box.setdefault("logits", logits[-1].clone()),
            join(prefill, logits),
        )[1]
        batch.add([backend.row(request, lambda text: None)])
        steps = 0
        while "logits" not in box:
            batch.step()
            steps += 1
        box["forward_calls"], box["steps"] = batch.forward_calls, steps
    torch.testing.assert_close(paused["logits"], whole["logits"], rtol=1e-3, atol=1e-3)
    chunks = -(-len(request.input_ids) // (CHUNK * RunningBatch.CHUNK_ALONE_FACTOR))
    # Each chunk begun once, then the decode step of the row that joined.
    assert paused["forward_calls"] == chunks + 1
    assert paused["steps"] > chunks  # and paused on the way


def test_a_newcomer_arriving_mid_chunk_gets_its_first_token_before_the_document_reads_on(
    backend,
):
    """Through the scheduler: a short prompt submitted while a document's chunk is half way
    through the model's layers is admitted at the next layer, prefilled and given its first
    token before that chunk, or any other, is read."""
    log: list[str] = []
    arrived = threading.Event()

    class Wrapped:
        def __getattr__(self, name):
            return getattr(backend, name)

        def new_batch(self):
            batch = backend.new_batch()
            batch.prefill_chunk, batch.store = CHUNK, None
            return batch

        def row(self, request, on_text):
            row = backend.row(request, on_text)
            accept = row.accept
            if request is newcomer:
                row.accept = lambda token, now: (log.append("newcomer token"), accept(token, now))
            return row

    scheduler = ContinuousScheduler(Wrapped(), max_batch=4)
    document = backend.request(DOCUMENT, max_new_tokens=2)
    newcomer = backend.request(STORY, max_new_tokens=2, min_new_tokens=2)
    done = {name: threading.Event() for name in ("document", "newcomer")}

    def sink(name):
        def on_event(event):
            if isinstance(event, Reading):
                log.append("document read a chunk")
            elif isinstance(event, Finished):
                done[name].set()

        return on_event

    def halfway(module, args, output):
        # The worker is inside the document's second chunk: the newcomer arrives now.
        if log == ["document read a chunk"] and not arrived.is_set():
            arrived.set()
            log.append("newcomer arrives")
            scheduler.submit(newcomer, sink("newcomer"))

    layers = backend.model.model.layers
    hook = layers[len(layers) // 2].register_forward_hook(halfway)
    try:
        scheduler.submit(document, sink("document"))
        assert done["newcomer"].wait(300) and done["document"].wait(300)
    finally:
        hook.remove()
        scheduler.close()
    after = log[log.index("newcomer arrives") :]
    assert after.index("newcomer token") < after.index("document read a chunk"), log


def test_a_newcomer_shows_its_first_words_before_the_document_reads_on(backend):
    """A short prompt that joins while a document is read decodes alone until its first text
    shows (or a few tokens pass): those steps read no chunk of the document."""
    batch = lone_batch(backend, chunk=64)
    reports: list[int] = []
    document = backend.row(backend.request(DOCUMENT, max_new_tokens=2), lambda text: None)
    document.on_reading = lambda read, total: reports.append(read)
    batch.add([document])
    batch.step()
    assert len(reports) == 1
    short = backend.row(backend.request(STORY, max_new_tokens=20), lambda text: None)
    batch.add([short])
    assert short.new_ids and batch.pending
    while not short.shown and len(short.new_ids) < batch.FIRST_TOKENS and short.reason is None:
        batch.step()
    assert len(reports) == 1  # the document waited
    while not document.new_ids:
        batch.step()
    assert len(reports) > 1


def test_a_paused_chunk_of_two_newcomers_loses_the_cancelled_one_and_reads_the_other_right(
    backend,
):
    """Two long prompts read together; one is cancelled while their chunk is paused between
    layers: the paused chunk is read again for the other alone, whose first-token logits are
    those of a whole prefill of it."""
    other = backend.request(LONG_PROMPT, max_new_tokens=2)
    whole = {}
    batch = lone_batch(backend, 0)
    batch._join = lambda prefill, logits, join=batch._join: (
        whole.setdefault("logits", logits[-1].clone()),
        join(prefill, logits),
    )[1]
    batch.add([backend.row(other, lambda text: None)])

    batch = lone_batch(backend)
    quitter = backend.request(DOCUMENT, max_new_tokens=2)
    batch.add([backend.row(quitter, lambda text: None), backend.row(other, lambda text: None)])
    batch.step()  # a first chunk of both, whole
    checks = iter(range(10**6))
    batch.pause_when = lambda: next(checks) == 5
    batch.step()  # the second, paused
    assert batch.pending[0].paused is not None
    quitter.cancel.set()
    batch.drop_cancelled()
    chunked = {}
    batch._join = lambda prefill, logits, join=batch._join: (
        chunked.setdefault("logits", logits[-1].clone()),
        join(prefill, logits),
    )[1]
    while "logits" not in chunked:
        batch.step()
    torch.testing.assert_close(chunked["logits"], whole["logits"], rtol=1e-3, atol=1e-3)
