"""Continuous batching on the real model: rows join a running batch and leave it the step they end."""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest

from chat.engine.local.scheduler import ContinuousScheduler
from chat.engine.types import Finished, Started, TextChunk

pytestmark = pytest.mark.integration

COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]
CAPITAL = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1}},
    "required": ["answer"],
    "additionalProperties": False,
}


class Recorder:
    """The real backend, with the scheduler's running batch in view: its joins and its steps."""

    def __init__(self, backend):
        self.backend = backend
        self.batch = None
        self.joins: list[int] = []  # rows prefilled together, per join

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def new_batch(self):
        self.batch = self.backend.new_batch()
        add = self.batch.add
        self.batch.add = lambda rows: (rows and self.joins.append(len(rows)), add(rows))[1]
        return self.batch


class Client:
    """One request's events as the scheduler hands them out, with the step each arrived on."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.events: list[object] = []
        self.steps: list[int] = []
        self.started = threading.Event()
        self.first_chunk = threading.Event()
        self.done = threading.Event()
        self.on_chunk = None

    def __call__(self, event) -> None:
        batch = self.recorder.batch
        self.events.append(event)
        self.steps.append(batch.forward_calls if batch is not None else 0)
        if isinstance(event, Started):
            self.started.set()
        if isinstance(event, TextChunk):
            self.first_chunk.set()
            if self.on_chunk:
                self.on_chunk()
        if isinstance(event, Finished):
            self.done.set()

    @property
    def result(self):
        return self.events[-1].result

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextChunk))

    def step_of(self, kind) -> int:
        return next(s for e, s in zip(self.events, self.steps, strict=True) if isinstance(e, kind))


def test_a_newcomer_streams_while_a_long_answer_runs(backend):
    """A request that arrives mid-answer starts at once and sees its first chunk long before the other ends."""
    recorder = Recorder(backend)
    scheduler = ContinuousScheduler(recorder, max_batch=4)
    long, newcomer = Client(recorder), Client(recorder)
    scheduler.submit(backend.request(STORY, max_new_tokens=60, min_new_tokens=60), long)
    assert long.first_chunk.wait(60)
    _, position = scheduler.submit(backend.request(COUNT, max_new_tokens=8), newcomer)
    assert newcomer.done.wait(60) and long.done.wait(120)
    scheduler.close()
    assert position == 0
    assert newcomer.step_of(TextChunk) < long.step_of(Finished)
    assert newcomer.step_of(Finished) < long.step_of(Finished)
    assert recorder.joins == [1, 1]  # the newcomer joined the running batch
    assert long.result.finish_reason == "length" and long.result.new_tokens == 60
    assert newcomer.text == newcomer.result.text


def test_a_steps_text_is_handed_on_after_the_step_not_during_it(backend):
    """The sinks hear a step's text once the batch call that made it returns: a sink called
    mid-step wakes the event loop, whose Python then holds the GIL the worker needs to pick the
    next row's token. Each step's text still comes before the next step starts."""
    recorder = Recorder(backend)
    inside = threading.Event()
    made = recorder.new_batch

    def new_batch():
        batch = made()
        for name in ("add", "step"):
            call = getattr(batch, name)

            def marked(*args, call=call):
                inside.set()
                try:
                    return call(*args)
                finally:
                    inside.clear()

            setattr(batch, name, marked)
        return batch

    recorder.new_batch = new_batch
    scheduler = ContinuousScheduler(recorder, max_batch=4)
    clients = [Client(recorder) for _ in range(3)]
    heard_inside: list[bool] = []
    for client in clients:
        client.on_chunk = lambda: heard_inside.append(inside.is_set())
        scheduler.submit(backend.request(STORY, max_new_tokens=12, min_new_tokens=12), client)
    assert all(client.done.wait(120) for client in clients)
    scheduler.close()
    assert heard_inside and not any(heard_inside)
    for client in clients:
        steps = [
            s for e, s in zip(client.events, client.steps, strict=True) if isinstance(e, TextChunk)
        ]
        assert len(set(steps)) >= 4  # streamed step by step, not all at the end
        assert client.text == client.result.text


def test_each_tokens_text_comes_with_the_step_that_made_it(backend):
    """A token's text is handed on in the batch call that chose it, not a word later: the
    first text with the prefill's call, then a piece nearly every step (a token that ends
    inside a character waits for the rest)."""
    recorder = Recorder(backend)
    scheduler = ContinuousScheduler(recorder, max_batch=4)
    clients = [Client(recorder) for _ in range(2)]
    for client, messages in zip(clients, (STORY, COUNT), strict=True):
        scheduler.submit(backend.request(messages, max_new_tokens=16, min_new_tokens=16), client)
    assert all(client.done.wait(120) for client in clients)
    scheduler.close()
    for client in clients:
        started = client.step_of(Started)
        steps = [
            s for e, s in zip(client.events, client.steps, strict=True) if isinstance(e, TextChunk)
        ]
        assert steps[0] == started + 1  # the prefill's forward pass made the first token
        assert len(steps) >= 14  # a piece of text for (nearly) every one of the 16 tokens
        assert client.text == client.result.text


def test_rows_end_their_own_ways_while_others_join(backend):
    """Five endings in one running batch (greedy, sampled and constrained rows together), the rows
    joining after it started: each ends by its own rule."""
    recorder = Recorder(backend)
    scheduler = ContinuousScheduler(recorder, max_batch=8)
    first = Client(recorder)
    scheduler.submit(backend.request(STORY, max_new_tokens=40, min_new_tokens=40), first)
    assert first.first_chunk.wait(60)
    names = ["stop", "comma", "short", "cancelled", "plain", "json", "sampled"]
    clients = {name: Client(recorder) for name in names}
    requests = {
        "stop": backend.request(COUNT, max_new_tokens=40, stop_strings=(", 5",)),
        "comma": backend.request(COUNT, max_new_tokens=40, eos_token_ids=(backend.token_id(","),)),
        "short": backend.request(COUNT, max_new_tokens=4),
        "cancelled": backend.request(STORY, max_new_tokens=40),
        "plain": backend.request([{"role": "user", "content": "Say hello."}], max_new_tokens=12),
        "json": backend.request(CAPITAL, max_new_tokens=60, json_schema=SCHEMA),
        "sampled": backend.request(
            STORY, max_new_tokens=6, min_new_tokens=6, temperature=0.8, top_p=0.9
        ),
    }
    tickets = {}
    clients["cancelled"].on_chunk = lambda: scheduler.cancel(tickets["cancelled"])
    for name in names:
        tickets[name], _ = scheduler.submit(requests[name], clients[name])
    assert all(c.done.wait(120) for c in [first, *clients.values()])
    scheduler.close()
    reasons = {name: clients[name].result.finish_reason for name in names}
    assert reasons["stop"] == "stop_string" and ", 5" not in clients["stop"].result.text
    assert reasons["comma"] == "eos" and clients["comma"].result.text.endswith(",")
    assert reasons["short"] == "length" and clients["short"].result.new_tokens == 4
    assert reasons["cancelled"] == "cancelled"
    assert reasons["plain"] in ("eos", "length")  # greedy wording may or may not end on eos
    assert reasons["json"] == "eos"
    jsonschema.validate(json.loads(clients["json"].result.text), SCHEMA)
    assert reasons["sampled"] == "length" and clients["sampled"].result.new_tokens == 6
    for client in [first, *clients.values()]:
        assert client.text == client.result.text
    assert first.result.finish_reason == "length" and first.result.new_tokens == 40
    assert all(clients[n].step_of(Started) < first.step_of(Finished) for n in names)


def test_a_cancelled_row_costs_no_further_steps_and_frees_its_row_at_once(backend):
    """Cancel a running answer: no token is computed for it afterwards, and the waiter starts next step."""
    recorder = Recorder(backend)
    scheduler = ContinuousScheduler(recorder, max_batch=1)
    running, waiter = Client(recorder), Client(recorder)
    ticket, _ = scheduler.submit(backend.request(STORY, max_new_tokens=200), running)
    assert running.first_chunk.wait(60)
    _, position = scheduler.submit(backend.request(COUNT, max_new_tokens=6), waiter)
    assert position == 1 and scheduler.waiting == 1
    steps_at_cancel = recorder.batch.forward_calls
    scheduler.cancel(ticket)
    assert running.done.wait(60) and waiter.done.wait(60)
    scheduler.close()
    result = running.result
    assert result.finish_reason == "cancelled"
    # one prefill + one step per token after the first; at most the step already under way follows
    assert result.new_tokens <= steps_at_cancel + 1
    assert waiter.step_of(Started) <= steps_at_cancel + 1
    assert waiter.result.finish_reason == "length" and waiter.result.new_tokens == 6


def test_a_cancelled_row_leaves_the_cache_before_the_next_step(backend):
    """In the batch itself: a cancelled row is dropped from the KV cache and gets no more tokens."""
    batch = backend.new_batch()
    story = backend.row(backend.request(STORY, max_new_tokens=50), lambda _t: None)
    count = backend.row(backend.request(COUNT, max_new_tokens=50), lambda _t: None)
    batch.add([story, count])
    batch.step()
    story.request.cancel.set()
    tokens = len(story.new_ids)
    assert batch.drop_cancelled() == [story] and story.reason == "cancelled"
    batch.step()
    batch.step()
    assert len(batch) == 1 and batch.cache.layers[0].keys.shape[0] == 1
    assert len(story.new_ids) == tokens and len(count.new_ids) == 4


def test_constrained_json_runs_beside_streamed_prose(backend):
    """A schema-constrained row and a prose row share one batch: the prose streams, the JSON validates."""
    batch_sizes = []
    original = backend.new_batch

    def recording():
        batch = original()
        add = batch.add
        batch.add = lambda rows: (batch_sizes.append(len(rows)), add(rows))[1]
        return batch

    backend.new_batch = recording
    try:
        prose_chunks, json_chunks = [], []
        prose, constrained = backend.generate_batch(
            [
                backend.request(STORY, max_new_tokens=24, min_new_tokens=24),
                backend.request(CAPITAL, max_new_tokens=60, json_schema=SCHEMA),
            ],
            [prose_chunks.append, json_chunks.append],
        )
    finally:
        del backend.new_batch
    assert batch_sizes == [2]
    assert len(prose_chunks) > 3 and "".join(prose_chunks) == prose.text
    assert prose.finish_reason == "length" and prose.new_tokens == 24
    assert constrained.finish_reason == "eos" and "".join(json_chunks) == constrained.text
    jsonschema.validate(json.loads(constrained.text), SCHEMA)


def test_the_kv_budget_keeps_a_request_waiting_until_a_row_ends(backend):
    """With room for one row only, a second request waits (position 1) and starts when the first ends."""
    recorder = Recorder(backend)
    request = backend.request(COUNT, max_new_tokens=10, min_new_tokens=10)
    one_row = (len(request.input_ids) + 10) * backend.kv_bytes_per_token()  # prompt + max_new
    scheduler = ContinuousScheduler(recorder, max_batch=8, kv_budget_bytes=one_row)
    first, second = Client(recorder), Client(recorder)
    scheduler.submit(request, first)
    assert first.started.wait(60)
    _, position = scheduler.submit(backend.request(COUNT, max_new_tokens=10), second)
    assert position == 1
    assert first.done.wait(60) and second.done.wait(60)
    scheduler.close()
    assert second.step_of(Started) >= first.step_of(Finished)
    assert recorder.joins == [1, 1]
