"""Prefix KV reuse on the real model: a turn's logits are the same with and without it.

Each test gets its own store, so what another test left behind is never reused here.
"""

from __future__ import annotations

import pytest
import torch

from chat.engine.local.decoding import RunningBatch
from chat.engine.local.prefix_store import PrefixStore

pytestmark = pytest.mark.integration

SYSTEM = {
    "role": "system",
    "content": "You are a careful assistant for a lighthouse museum. " * 8,
}
FIRST = [SYSTEM, {"role": "user", "content": "Who kept the lighthouse in winter?"}]
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]
TOLERANCE = {"rtol": 1e-3, "atol": 1e-3}


def batch_for(backend, store: PrefixStore | None, chunk: int = 0) -> RunningBatch:
    return RunningBatch(
        backend.model,
        backend.pad_id,
        backend.stop_string_criteria,
        prefill_chunk=chunk,
        prefix_store=store,
    )


def watch_joins(batch: RunningBatch) -> dict:
    """Record each row's first-token logits as it joins, by its request."""
    seen, join = {}, batch._join

    def recording(prefill, logits):
        for index, row in enumerate(prefill.rows):
            seen[id(row.request)] = logits[index].clone()
        return join(prefill, logits)

    batch._join = recording  # type: ignore[method-assign]  # a spy on the batch's joins
    return seen


def run(batch: RunningBatch, rows) -> None:
    batch.add(list(rows))
    while any(row.reason is None for row in rows):
        batch.drop_cancelled()
        batch.step()


def first_logits(backend, request, store: PrefixStore | None) -> torch.Tensor:
    batch = batch_for(backend, store)
    seen = watch_joins(batch)
    batch.add([backend.row(request, lambda text: None)])
    return seen[id(request)]


def answered(backend, store: PrefixStore, messages, max_new_tokens: int = 12) -> list[dict]:
    """The conversation after one answer, generated in a batch that stores into `store`."""
    row = backend.row(backend.request(messages, max_new_tokens=max_new_tokens), lambda text: None)
    run(batch_for(backend, store), [row])
    return [*messages, {"role": "assistant", "content": row.text}]


def follow_up(backend, store: PrefixStore, text: str = "And in summer?"):
    history = answered(backend, store, FIRST)
    return backend.request([*history, {"role": "user", "content": text}], max_new_tokens=4)


def test_a_follow_up_prefills_only_its_new_tokens_and_gets_the_same_logits(backend):
    store = PrefixStore(64 * 1024 * 1024)
    request = follow_up(backend, store)
    computed, reused = store.computed_tokens, store.reused_tokens

    with_reuse = first_logits(backend, request, store)

    taken = store.reused_tokens - reused
    assert taken >= len(backend.encode(FIRST))  # at least the whole first prompt
    assert store.computed_tokens - computed == len(request.input_ids) - taken
    torch.testing.assert_close(with_reuse, first_logits(backend, request, None), **TOLERANCE)


def test_rows_reusing_different_lengths_join_a_running_batch_with_the_same_logits(backend):
    """A follow-up (long reuse), a fresh prompt (none) and a half-shared one join a decoding
    row together, their remainders prefilled a chunk per step."""
    store = PrefixStore(64 * 1024 * 1024)
    requests = [
        follow_up(backend, store),
        backend.request(
            [{"role": "user", "content": "Name three colours of the sea. " * 6}], max_new_tokens=3
        ),
        backend.request(
            [SYSTEM, {"role": "user", "content": "When was it built?"}], max_new_tokens=3
        ),
    ]
    batch = batch_for(backend, store, chunk=16)
    runner = backend.row(
        backend.request(STORY, max_new_tokens=60, min_new_tokens=60), lambda t: None
    )
    batch.add([runner])
    batch.step()
    seen = watch_joins(batch)
    rows = [backend.row(request, lambda text: None) for request in requests]
    reused = store.reused_tokens
    batch.add(rows)
    assert batch.pending  # the fresh prompt's remainder is longer than a chunk
    while any(row.reason is None for row in rows):
        batch.step()
    assert store.reused_tokens > reused
    assert runner.reason is None  # it decoded on throughout
    for request in requests:
        torch.testing.assert_close(
            seen[id(request)], first_logits(backend, request, None), **TOLERANCE
        )


def test_conversations_arriving_together_prefill_their_shared_system_prompt_once(backend):
    store = PrefixStore(64 * 1024 * 1024)
    requests = [
        backend.request(
            [SYSTEM, {"role": "user", "content": f"Question {n}: why?"}], max_new_tokens=2
        )
        for n in range(4)
    ]
    system = len(backend.encode([SYSTEM]))
    batch = batch_for(backend, store)
    seen = watch_joins(batch)
    run(batch, [backend.row(request, lambda text: None) for request in requests])

    total = sum(len(request.input_ids) for request in requests)
    assert store.computed_tokens + store.reused_tokens >= total
    # The system prompt was computed once, not four times.
    assert store.computed_tokens <= total - 3 * system
    for request in requests:
        torch.testing.assert_close(
            seen[id(request)], first_logits(backend, request, None), **TOLERANCE
        )


def test_a_row_cancelled_mid_prefill_stores_nothing(backend):
    store = PrefixStore(64 * 1024 * 1024)
    batch = batch_for(backend, store, chunk=16)
    runner = backend.row(
        backend.request(STORY, max_new_tokens=40, min_new_tokens=40), lambda t: None
    )
    batch.add([runner])
    while not runner.new_ids:  # its prompt may be longer than a chunk read alone
        batch.step()
    batch.step()
    held = len(store)
    request = backend.request(FIRST, max_new_tokens=4)
    batch.add([backend.row(request, lambda text: None)])
    batch.step()  # one chunk of its prompt computed
    request.cancel.set()
    batch.drop_cancelled()
    assert len(store) == held
    assert store.longest(request.input_ids, len(request.input_ids))[0] < 16


def test_a_row_cancelled_mid_answer_leaves_only_its_prompt(backend):
    """Its prompt was stored when it joined (complete); none of its answer ever is."""
    store = PrefixStore(64 * 1024 * 1024)
    batch = batch_for(backend, store)
    request = backend.request(STORY, max_new_tokens=40, min_new_tokens=40)
    row = backend.row(request, lambda text: None)
    batch.add([row])
    for _ in range(5):
        batch.step()
    request.cancel.set()
    batch.drop_cancelled()
    ids = request.input_ids + row.new_ids
    assert store.longest(ids, len(ids))[0] == len(request.input_ids)


def test_an_evicted_entry_is_never_read(backend):
    first = backend.request(FIRST, max_new_tokens=1)
    other = backend.request(STORY, max_new_tokens=1)
    # Room for the longer prompt's KV alone: storing the second evicts the first.
    room = backend.kv_bytes_per_token() * (max(len(first.input_ids), len(other.input_ids)) + 8)
    store = PrefixStore(room)
    for request in (first, other):
        run(batch_for(backend, store), [backend.row(request, lambda text: None)])
    assert store.evictions >= 1 and store.nbytes <= room
    reused = store.reused_tokens
    again = backend.request([*FIRST, {"role": "user", "content": "Again?"}], max_new_tokens=1)
    logits = first_logits(backend, again, store)
    assert store.reused_tokens - reused < 8  # at most the chat template's opening tokens
    torch.testing.assert_close(logits, first_logits(backend, again, None), **TOLERANCE)


def test_rows_under_every_rule_reuse_a_prefix(backend):
    """Constrained, penalised, stop-string and sampled rows run to their ends on reused KV."""
    store = PrefixStore(64 * 1024 * 1024)
    history = answered(backend, store, FIRST)
    ask = [*history, {"role": "user", "content": "Answer as JSON."}]
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
    }
    requests = [
        backend.request(ask, max_new_tokens=24, json_schema=schema),
        backend.request(ask, max_new_tokens=8, repetition_penalty=1.3, no_repeat_ngram_size=3),
        backend.request(ask, max_new_tokens=8, stop_strings=("the", ".")),
        backend.request(ask, max_new_tokens=8, temperature=0.8, top_p=0.9),
    ]
    reused = store.reused_tokens
    rows = [backend.row(request, lambda text: None) for request in requests]
    run(batch_for(backend, store), rows)
    assert store.reused_tokens - reused >= 4 * len(backend.encode(FIRST))
    assert all(row.reason in ("eos", "stop_string", "length") for row in rows)
    assert all(0 < len(row.new_ids) <= row.max_new for row in rows)


@pytest.mark.django_db(transaction=True)
async def test_a_follow_up_turn_is_counted_as_reused_prefill_in_the_metrics(client, scrape_metrics):
    """Over the WebSocket: the second turn of a conversation prefills only what is new."""

    def sample(text: str, source: str) -> float:
        name = f'chat_prefill_tokens_total{{source="{source}"}}'
        for line in text.splitlines():
            if line.split(" ")[0] == name:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    first = await client.receive_until("done", await client.prompt("Name a colour of the sea."))
    conversation = first[0]["conversation"]
    before = await scrape_metrics()
    second = await client.receive_until(
        "done", await client.prompt("And of the sky?", conversation=conversation)
    )
    after = await scrape_metrics()
    prompt_tokens = second[-1]["metrics"]["prompt_tokens"]
    reused = sample(after, "reused") - sample(before, "reused")
    computed = sample(after, "computed") - sample(before, "computed")
    assert reused >= first[-1]["metrics"]["prompt_tokens"]
    assert reused + computed == prompt_tokens
    assert "chat_prefix_cache_bytes" in after and "chat_coalesced_requests_total" in after


def kv(length: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One layer of made-up KV for `length` tokens (the store's bookkeeping needs no model)."""
    return [torch.arange(length, dtype=torch.float32).reshape(1, 1, length, 1)], [
        torch.zeros(1, 1, length, 1)
    ]


def test_the_store_keeps_the_longest_row_of_a_prefix_and_evicts_the_least_recently_used():
    per_token = 8  # one float32 key and one value per token
    store = PrefixStore(10 * per_token)
    assert store.put([1, 2, 3], *kv(3))
    assert store.put([1, 2, 3, 4, 5], *kv(5))  # extends the first: replaces it
    assert len(store) == 1 and store.nbytes == 5 * per_token
    assert not store.put([1, 2], *kv(2))  # already held
    assert store.longest([1, 2, 3, 9], 3) == (3, store.longest([1, 2, 3], 3)[1])
    assert store.longest([1, 2, 3, 9], 2)[0] == 2  # never more than asked
    assert store.put([7, 8, 9, 10], *kv(4))
    store.longest([1, 2, 9], 2)  # [1..5] is now the more recently used
    assert store.put([5, 6, 7], *kv(3))  # over budget: [7, 8, 9, 10] goes
    assert store.longest([7, 8, 9], 3) == (0, None)
    assert store.longest([1, 2, 3, 4, 5, 6], 6)[0] == 5 and store.evictions == 1
    assert store.nbytes <= store.max_bytes
    assert not store.put(list(range(20)), *kv(20))  # alone over the budget
    assert not PrefixStore(0).put([1, 2], *kv(2))  # 0: reuse off


class CountedClones(torch.Tensor):
    """A tensor that counts the copies made of it (the store copies what it keeps)."""

    clones = 0

    def clone(self, *args, **kwargs):
        CountedClones.clones += 1
        return super().clone(*args, **kwargs)


def test_a_row_over_the_budget_is_refused_before_it_is_copied_and_takes_nothing_with_it():
    """A document's KV (hundreds of MB) must not be copied only to be refused: the copy alone
    would raise the process's peak memory; and the entry it extends stays."""
    per_token = 8
    store = PrefixStore(10 * per_token)
    assert store.put([1, 2, 3], *kv(3))
    keys, values = kv(20)
    CountedClones.clones = 0
    watched = [t.as_subclass(CountedClones) for t in (*keys, *values)]
    assert not store.put(list(range(1, 21)), watched[:1], watched[1:])
    assert CountedClones.clones == 0
    assert store.longest([1, 2, 3, 4], 3)[0] == 3 and store.nbytes == 3 * per_token


def test_swapping_the_models_modules_empties_the_store(backend):
    """Quantizing (or wrapping) linears swaps modules in place: KV computed before is never read."""
    import copy

    store = PrefixStore(64 * 1024 * 1024)
    request = backend.request(FIRST, max_new_tokens=1)
    run(batch_for(backend, store), [backend.row(request, lambda text: None)])
    assert len(store) == 1
    original = backend.model.model.norm
    backend.model.model.norm = copy.deepcopy(original)  # same numbers, another module
    try:
        reused = store.reused_tokens
        run(batch_for(backend, store), [backend.row(request, lambda text: None)])
        assert store.reused_tokens == reused
    finally:
        backend.model.model.norm = original
