"""Chunked prefill on the real model: a long prompt joins running rows a chunk per decode step."""

from __future__ import annotations

import pytest
import torch

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
