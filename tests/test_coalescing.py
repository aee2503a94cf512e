"""Identical prompts in flight share one generation: on the real model and over the WebSocket."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async

from chat.engine.local.scheduler import ContinuousScheduler
from chat.engine.sharing.coalescing import Coalescer
from chat.engine.sharing.coalescing_across import AcrossProcesses
from chat.engine.types import Finished, Started, TextChunk
from chat.models import Message
from tests.conftest import TEST_CACHE_URL

pytestmark = pytest.mark.integration

STORY = [{"role": "user", "content": "Write a long story about a dragon."}]
ws_db = pytest.mark.django_db(transaction=True)


class Listener:
    """One request's events as a sink receives them."""

    def __init__(self):
        self.events: list[object] = []
        self.first_chunk = threading.Event()
        self.done = threading.Event()

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, TextChunk):
            self.first_chunk.set()
        if isinstance(event, Finished):
            self.done.set()

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextChunk))

    @property
    def result(self):
        return self.events[-1].result


class CountingScheduler(ContinuousScheduler):
    def __init__(self, *args, **kwargs):
        self.submitted = 0
        super().__init__(*args, **kwargs)

    def submit(self, request, sink, *, expected=False):
        self.submitted += 1
        return super().submit(request, sink, expected=expected)


@pytest.fixture
def scheduler(backend):
    scheduler = CountingScheduler(backend, max_batch=4)
    yield scheduler
    scheduler.close()


def test_identical_requests_share_one_generation_and_each_gets_all_of_it(backend, scheduler):
    coalescer = Coalescer()
    request = backend.request(STORY, max_new_tokens=30, min_new_tokens=30)
    first, late = Listener(), Listener()
    coalescer.sharing(scheduler, "key").submit(request, first)
    assert first.first_chunk.wait(120)
    # Joins mid-answer: the text so far in one chunk, then the live ones.
    _, position = coalescer.sharing(scheduler, "key").submit(
        backend.request(STORY, max_new_tokens=30, min_new_tokens=30), late
    )
    assert position == 0
    assert first.done.wait(120) and late.done.wait(120)
    assert scheduler.submitted == 1 and coalescer.joined == 1
    assert isinstance(late.events[0], Started) and isinstance(late.events[1], TextChunk)
    assert first.text == late.text == first.result.text
    assert late.result is first.result and first.result.finish_reason == "length"
    assert coalescer.in_flight() == 0


def test_a_different_key_or_prompt_never_joins(backend, scheduler):
    coalescer = Coalescer()
    listeners = [Listener() for _ in range(3)]
    for listener, (key, content) in zip(
        listeners, [("a", "Hi."), ("b", "Hi."), ("a", "Hello.")], strict=True
    ):
        request = backend.request([{"role": "user", "content": content}], max_new_tokens=3)
        coalescer.sharing(scheduler, key).submit(request, listener)
    assert all(listener.done.wait(120) for listener in listeners)
    assert scheduler.submitted == 3 and coalescer.joined == 0
    assert coalescer.sharing(scheduler, None) is scheduler  # uncacheable turns never share


def test_a_joiners_cancel_leaves_the_others_and_the_last_one_stops_the_generation(
    backend, scheduler
):
    coalescer = Coalescer(count_tokens=backend.token_count)
    listeners = [Listener() for _ in range(3)]
    views = [coalescer.sharing(scheduler, "key") for _ in listeners]
    tickets = [
        view.submit(backend.request(STORY, max_new_tokens=200, min_new_tokens=200), listener)[0]
        for view, listener in zip(views, listeners, strict=True)
    ]
    assert listeners[0].first_chunk.wait(120)
    views[1].cancel(tickets[1])
    assert listeners[1].done.is_set() and listeners[1].result.finish_reason == "cancelled"
    # It leaves with the tokens of the text it received, which its turn charges.
    assert listeners[1].result.new_tokens >= backend.token_count(listeners[1].text) > 0
    views[0].cancel(tickets[0])
    assert listeners[0].result.finish_reason == "cancelled"
    assert listeners[0].result.new_tokens >= listeners[1].result.new_tokens
    assert not listeners[2].done.is_set() and scheduler.running == 1  # still generating for it
    views[2].cancel(tickets[2])
    assert listeners[2].done.wait(60)
    result = listeners[2].result
    assert result.finish_reason == "cancelled" and result.new_tokens < 200
    assert scheduler.submitted == 1 and coalescer.in_flight() == 0


def two_processes(count_tokens=None) -> tuple[Coalescer, Coalescer]:
    """Two Coalescers on one Redis, as two daphne processes have (tests/test_coalescing_across.py
    runs two real ones)."""
    processes = Coalescer(), Coalescer()
    for process in processes:
        process.across = AcrossProcesses(lambda: TEST_CACHE_URL, count_tokens=count_tokens)
    return processes


def test_a_second_process_follows_the_first_ones_generation(backend, scheduler):
    a, b = two_processes()
    first, second = Listener(), Listener()
    a.sharing(scheduler, "key").submit(
        backend.request(STORY, max_new_tokens=30, min_new_tokens=30), first
    )
    assert first.first_chunk.wait(120)
    b.sharing(scheduler, "key").submit(
        backend.request(STORY, max_new_tokens=30, min_new_tokens=30), second
    )
    assert first.done.wait(120) and second.done.wait(120)
    assert scheduler.submitted == 1 and b.across is not None and b.across.joined == 1
    assert first.text == second.text == first.result.text == second.result.text
    assert second.result.finish_reason == "length" and second.result.new_tokens == 30
    assert a.in_flight() == b.in_flight() == 0


def test_a_follower_or_owner_leaving_a_generation_shared_across_processes_has_its_tokens(
    backend, scheduler
):
    a, b = two_processes(backend.token_count)
    first, second = Listener(), Listener()
    views = a.sharing(scheduler, "key"), b.sharing(scheduler, "key")
    tickets = [
        view.submit(backend.request(STORY, max_new_tokens=200, min_new_tokens=200), listener)[0]
        for view, listener in zip(views, (first, second), strict=True)
    ]
    assert second.first_chunk.wait(120)
    views[0].cancel(tickets[0])  # the owner's listener leaves; the follower still listens
    assert first.done.wait(10) and first.result.finish_reason == "cancelled"
    assert first.result.new_tokens >= backend.token_count(first.text) > 0
    views[1].cancel(tickets[1])  # then the follower
    assert second.done.wait(10) and second.result.finish_reason == "cancelled"
    assert second.result.new_tokens >= backend.token_count(second.text) > 0
    assert scheduler.submitted == 1


def signed_in_session(name: str) -> tuple[object, str]:
    """A user of their own and a session key signed in as them."""
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.create_user(name, password="pw")
    client = Client()
    client.force_login(user)
    return user, client.cookies["sessionid"].value


@ws_db
async def test_a_listener_that_leaves_a_shared_generation_early_is_charged_what_it_received(
    make_client, runtime, make_policy, monkeypatch
):
    from chat.models import Usage

    await sync_to_async(make_policy)(slug="long", max_new_tokens=200)
    calls = []
    original = runtime.scheduler.submit
    monkeypatch.setattr(
        runtime.scheduler, "submit", lambda *a, **k: (calls.append(1), original(*a, **k))[1]
    )
    (stays, stays_key), (leaves, leaves_key) = [
        await sync_to_async(signed_in_session)(name) for name in ("stays", "leaves")
    ]
    first = await make_client(session_key=stays_key)
    second = await make_client(session_key=leaves_key)
    prompt = "Write a long story about a dragon, a lighthouse and a storm."
    first_id = await first.prompt(prompt, policy="long")
    await first.receive_until("chunk", first_id)
    second_id = await second.prompt(prompt, policy="long")
    await second.receive_until("chunk", second_id)  # joined: the text so far
    await second.send({"type": "cancel", "request_id": second_id})
    left = (await second.receive_until("done", second_id))[-1]
    assert left["finish_reason"] == "cancelled" and left["text"]
    assert left["metrics"]["new_tokens"] > 0
    kept = (await first.receive_until("done", first_id))[-1]
    assert len(calls) == 1  # one generation, shared
    usage = await sync_to_async(Usage.objects.get)(user=leaves)
    assert 0 < usage.tokens <= kept["metrics"]["new_tokens"] and usage.answers == 1
    assert (await sync_to_async(Usage.objects.get)(user=stays)).tokens == kept["metrics"][
        "new_tokens"
    ]


@ws_db
async def test_visitors_sending_the_same_prompt_at_once_share_one_generation(
    make_client, runtime, make_policy, monkeypatch
):
    """Each gets the whole answer, its own stored message and metrics; the model ran once."""
    await sync_to_async(make_policy)(slug="brief", max_new_tokens=40)
    calls = []
    original = runtime.scheduler.submit
    monkeypatch.setattr(
        runtime.scheduler, "submit", lambda *a, **k: (calls.append(1), original(*a, **k))[1]
    )
    clients = [await make_client() for _ in range(3)]
    prompt = "Write a long story about a dragon and a lighthouse."
    ids = [await chat.prompt(prompt, policy="brief") for chat in clients]
    done = await asyncio.gather(
        *(chat.receive_until("done", rid) for chat, rid in zip(clients, ids, strict=True))
    )
    ends = [events[-1] for events in done]
    assert len(calls) == 1
    assert len({end["message"] for end in ends}) == 3
    assert len({end["text"] for end in ends}) == 1 and all(not end["cached"] for end in ends)
    for events, end in zip(done, ends, strict=True):
        assert "".join(e["text"] for e in events if e["type"] == "chunk") == end["text"]
        message = await sync_to_async(Message.objects.get)(pk=end["message"])
        assert message.text == end["text"] and message.status == Message.Status.DONE
        assert message.metrics["ttft_ms"] == end["metrics"]["ttft_ms"]


def test_identical_requests_open_one_stream_to_an_inference_server(backend):
    """CHAT_BACKEND=openai: coalescing in front of the remote scheduler (the server, serving
    the real model's tokens, sees one request)."""
    from chat.engine.remote.concurrent import ConcurrentScheduler
    from chat.engine.remote.openai_backend import OpenAIBackend, RemoteConfig
    from harness.openai_server import FakeOpenAIServer

    server = FakeOpenAIServer(backend).start()
    remote = OpenAIBackend(
        RemoteConfig(
            base_url=server.url,
            model=server.model,
            timeout=120,
            context_length=backend.context_length,
        ),
        tokenizer=backend.tokenizer,
    )
    scheduler = ConcurrentScheduler(remote, max_running=4)
    try:
        coalescer = Coalescer()
        listeners = [Listener() for _ in range(3)]
        for listener in listeners:
            request = remote.request(STORY, max_new_tokens=24, min_new_tokens=24)
            coalescer.sharing(scheduler, "key").submit(request, listener)
        assert all(listener.done.wait(120) for listener in listeners)
        assert server.posts == 1 and coalescer.joined == 2
        assert len({listener.text for listener in listeners}) == 1
        assert listeners[0].text == listeners[0].result.text
        # Two processes on one Redis, each its own remote scheduler: still one stream.
        a, b = two_processes()
        other = ConcurrentScheduler(remote, max_running=4)
        try:
            first, second = Listener(), Listener()
            for process, on, listener in ((a, scheduler, first), (b, other, second)):
                request = remote.request(STORY, max_new_tokens=24, min_new_tokens=24)
                process.sharing(on, "key").submit(request, listener)
            assert first.done.wait(120) and second.done.wait(120)
        finally:
            other.close()
        assert server.posts == 2 and b.across is not None and b.across.joined == 1
        assert first.text == second.text == first.result.text == listeners[0].text
    finally:
        scheduler.close()
        server.stop()


def test_a_request_stopped_before_it_is_submitted_never_runs(backend, scheduler):
    """A Stop just before a re-ask is queued: the shared copy's own flag must not let it run."""
    coalescer = Coalescer()
    request = backend.request(STORY, max_new_tokens=30)
    request.cancel.set()
    listener = Listener()
    coalescer.sharing(scheduler, "key").submit(request, listener)
    assert listener.done.wait(60)
    assert listener.result.finish_reason == "cancelled" and listener.result.new_tokens == 0
    assert coalescer.in_flight() == 0
