"""The remote backend against a loopback OpenAI-compatible server that streams the real model's tokens."""

from __future__ import annotations

import threading

import pytest

from chat.engine.remote.concurrent import ConcurrentScheduler
from chat.engine.remote.openai_backend import OpenAIBackend, RemoteConfig
from chat.engine.types import (
    EngineError,
    Failed,
    Finished,
    PromptTooLong,
    Queued,
    Started,
    TextChunk,
)
from harness.liveserver import free_port
from harness.openai_server import FakeOpenAIServer, closing_upstream

COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
STORY = [{"role": "user", "content": "Write a very long story about a dragon."}]


@pytest.fixture(scope="module")
def fake(backend):
    server = FakeOpenAIServer(backend).start()
    yield server
    server.stop()


def remote_for(server, backend, **config) -> OpenAIBackend:
    config.setdefault("context_length", backend.context_length)
    return OpenAIBackend(
        RemoteConfig(base_url=server.url, model=server.model, timeout=120, **config),
        tokenizer=backend.tokenizer,
    )


@pytest.fixture
def remote(fake, backend):
    return remote_for(fake, backend)


@pytest.mark.integration
def test_streamed_chunks_assemble_to_the_real_models_answer_and_usage_maps(remote, fake, backend):
    """Chunks handed out concatenate to the result, which is the local model's own greedy answer; usage maps back."""
    chunks: list[str] = []
    result = remote.generate(remote.request(COUNT, max_new_tokens=40), chunks.append)
    served = fake.served[-1]
    local = backend.generate(backend.request(COUNT, max_new_tokens=40))
    assert len(chunks) > 3 and "".join(chunks) == result.text
    assert result.text == local.text and result.finish_reason == local.finish_reason
    assert served.body["stream"] is True and served.body["stream_options"] == {
        "include_usage": True
    }
    assert (result.new_tokens, result.prompt_tokens) == (served.new_tokens, served.prompt_tokens)
    assert result.first_token_at is not None


@pytest.mark.integration
def test_a_stop_string_ends_the_answer_as_stop_string_and_is_never_shown(remote, fake):
    """The policy's stop strings travel as `stop`; vLLM's stop_reason maps back to finish_reason stop_string."""
    chunks: list[str] = []
    result = remote.generate(
        remote.request(COUNT, max_new_tokens=40, stop_strings=(", 5",)), chunks.append
    )
    assert fake.served[-1].body["stop"] == [", 5"]
    assert result.finish_reason == "stop_string"
    assert result.text.strip() and ", 5" not in "".join(chunks) and "5" not in result.text


@pytest.mark.integration
def test_a_stop_string_the_server_streams_is_cut_and_closes_the_stream(backend):
    """A server that ignores `stop`: the client holds back and drops the marker, and hangs up on the rest."""
    leaky = FakeOpenAIServer(backend, leak_stop_strings=True).start()
    try:
        remote = remote_for(leaky, backend)
        chunks: list[str] = []
        result = remote.generate(
            remote.request(COUNT, max_new_tokens=40, stop_strings=(", 5",)), chunks.append
        )
        served = leaky.served[-1]
        assert leaky.wait_for(served.done.is_set)
    finally:
        leaky.stop()
    assert result.finish_reason == "stop_string" and "".join(chunks) == result.text
    assert result.text.strip() and "5" not in result.text
    assert served.client_gone_at is not None and served.finish_reason == "cancelled"


@pytest.mark.integration
def test_max_new_tokens_is_capped_and_ends_as_length(fake, backend):
    """max_tokens is the request's max_new_tokens, capped by the server-side ceiling; upstream "length" maps to length."""
    remote = remote_for(fake, backend, max_new_tokens_cap=6)
    result = remote.generate(remote.request(STORY, max_new_tokens=500))
    assert fake.served[-1].body["max_tokens"] == 6
    assert result.finish_reason == "length" and result.new_tokens == 6 and result.text


@pytest.mark.integration
def test_cancel_closes_the_upstream_stream_and_the_server_stops_generating(remote, fake):
    """Setting the cancel flag mid-answer shuts the connection; the server sees it and its model stops early."""
    request = remote.request(STORY, max_new_tokens=300)
    first = threading.Event()
    outcome: dict = {}
    worker = threading.Thread(
        target=lambda: outcome.update(result=remote.generate(request, lambda _t: first.set()))
    )
    worker.start()
    assert first.wait(120)
    request.cancel.set()
    worker.join(120)
    served = fake.served[-1]
    assert fake.wait_for(served.done.is_set)
    assert outcome["result"].finish_reason == "cancelled"
    assert served.client_gone_at is not None and served.finish_reason == "cancelled"
    assert served.new_tokens < 300


@pytest.mark.integration
def test_cancel_wakes_a_read_waiting_on_a_silent_upstream(remote, fake):
    """The server goes quiet after one chunk: the cancel still ends the call, because the socket is shut down under the read."""
    fake.stall_after_first_chunk = True
    try:
        request = remote.request(STORY, max_new_tokens=300)
        first = threading.Event()
        outcome: dict = {}
        worker = threading.Thread(
            target=lambda: outcome.update(result=remote.generate(request, lambda _t: first.set()))
        )
        worker.start()
        assert first.wait(120)
        request.cancel.set()
        worker.join(
            30
        )  # hang guard: without the shutdown the read would wait the full 120 s timeout
        assert not worker.is_alive() and outcome["result"].finish_reason == "cancelled"
        served = fake.served[-1]
        assert fake.wait_for(served.done.is_set) and served.client_gone_at is not None
    finally:
        fake.stall_after_first_chunk = False


@pytest.mark.integration
def test_an_upstream_that_is_down_gives_a_readable_engine_error(backend):
    """Nobody listening on the port: an EngineError that says the server refused the connection."""
    down = OpenAIBackend(
        RemoteConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", timeout=5),
        tokenizer=backend.tokenizer,
    )
    with pytest.raises(EngineError, match="refused the connection"):
        down.generate(down.request(COUNT, max_new_tokens=4))
    assert down.probe().startswith("unavailable")


@pytest.mark.integration
def test_an_upstream_500_gives_a_readable_engine_error(remote, fake):
    """An HTTP 500 becomes an EngineError carrying the status and the server's own message."""
    fake.fail_with = 500
    try:
        with pytest.raises(EngineError, match="HTTP 500.*engine died"):
            remote.generate(remote.request(COUNT, max_new_tokens=4))
    finally:
        fake.fail_with = None


@pytest.mark.integration
def test_a_malformed_event_gives_a_readable_engine_error(remote, fake):
    """An event that is not JSON ends the answer with an EngineError quoting it, not a parser traceback."""
    fake.garbage = b"{not json"
    try:
        with pytest.raises(EngineError, match="malformed event.*not json"):
            remote.generate(remote.request(COUNT, max_new_tokens=4))
    finally:
        fake.garbage = None


@pytest.mark.integration
def test_a_context_length_refusal_is_prompt_too_long(fake, backend):
    """With no local context limit, the server's "maximum context length" 400 becomes PromptTooLong."""
    remote = remote_for(fake, backend, context_length=0, max_new_tokens_cap=10**6)
    with pytest.raises(PromptTooLong, match="maximum context length"):
        remote.generate(remote.request(COUNT, max_new_tokens=10**6))


@pytest.mark.integration
def test_the_api_key_is_sent_as_a_bearer_token(backend):
    """A server that requires a key answers with the right one and refuses a wrong one readably."""
    guarded = FakeOpenAIServer(backend, api_key="s3cret").start()
    try:
        good = remote_for(guarded, backend, api_key="s3cret")
        bad = remote_for(guarded, backend, api_key="wrong")
        assert good.probe() == "ok" and "401" in bad.probe()
        assert good.generate(good.request(COUNT, max_new_tokens=3)).new_tokens == 3
        with pytest.raises(EngineError, match="credentials"):
            bad.generate(bad.request(COUNT, max_new_tokens=3))
    finally:
        guarded.stop()


class Events:
    """A sink that records a ticket's events and lets a test wait for one."""

    def __init__(self):
        self.items: list = []
        self.cond = threading.Condition()

    def __call__(self, event) -> None:
        with self.cond:
            self.items.append(event)
            self.cond.notify_all()

    def wait(self, kind, timeout: float = 120):
        with self.cond:
            assert self.cond.wait_for(
                lambda: any(isinstance(e, kind) for e in self.items), timeout
            ), self.items
            return next(e for e in self.items if isinstance(e, kind))

    def has(self, kind) -> bool:
        with self.cond:
            return any(isinstance(e, kind) for e in self.items)


@pytest.mark.unit
def test_a_misconfigured_remote_backend_fails_at_start_up_with_a_clear_message():
    """CHAT_BACKEND=openai without a URL, or with a bad number, stops Django from starting and says what to set."""
    import os
    import subprocess
    import sys

    from harness.liveserver import ROOT

    def start(**env) -> str:
        done = subprocess.run(
            [sys.executable, "-c", "import django; django.setup()"],
            cwd=ROOT,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings", **env},
            capture_output=True,
            text=True,
        )
        assert done.returncode != 0
        return done.stderr

    assert "needs CHAT_REMOTE" in start(CHAT_BACKEND="openai", CHAT_REMOTE="?model=m")
    assert "needs the served model's name" in start(
        CHAT_BACKEND="openai", CHAT_REMOTE="http://127.0.0.1:1/v1"
    )
    assert "CHAT_REMOTE timeout='soon' is not a number" in start(
        CHAT_BACKEND="openai", CHAT_REMOTE="http://127.0.0.1:1/v1?model=m&timeout=soon"
    )
    assert "unknown option(s) modle" in start(
        CHAT_BACKEND="openai", CHAT_REMOTE="http://127.0.0.1:1/v1?modle=m"
    )
    assert "CHAT_BACKEND='vllm'" in start(CHAT_BACKEND="vllm")


@pytest.mark.integration
def test_two_requests_stream_at_once_and_a_third_waits_with_a_truthful_position(remote, fake):
    """Two slots: two streams are open upstream together, the third waits at position 1, a cancelled waiter leaves at once."""
    scheduler = ConcurrentScheduler(remote, max_running=2)
    sinks = [Events() for _ in range(4)]
    requests = [remote.request(STORY, max_new_tokens=200) for _ in range(4)]
    before = len(fake.served)
    try:
        placed = [scheduler.submit(r, s) for r, s in zip(requests, sinks, strict=True)]
        assert [position for _, position in placed] == [0, 0, 1, 2]
        sinks[0].wait(TextChunk)
        sinks[1].wait(TextChunk)
        assert fake.active == 2 and len(fake.served) - before == 2
        assert (scheduler.running, scheduler.waiting) == (2, 2)
        assert not sinks[2].has(Started)

        scheduler.cancel(placed[3][0])  # a waiter: gone at once, the server never hears of it
        assert (
            sinks[3].wait(Finished).result.finish_reason == "cancelled" and scheduler.waiting == 1
        )

        scheduler.cancel(placed[0][0])  # a runner: its slot goes to the third request
        assert sinks[0].wait(Finished).result.finish_reason == "cancelled"
        sinks[2].wait(TextChunk)
        assert not sinks[3].has(Started) and len(fake.served) - before == 3
    finally:
        for ticket, _ in placed:
            scheduler.cancel(ticket)
        for sink in sinks:
            sink.wait(Finished)
        scheduler.close()
    assert not any(isinstance(e, Failed) for sink in sinks for e in sink.items)
    assert [e.position for e in sinks[2].items if isinstance(e, Queued)] == [
        1
    ]  # behind a runner, never behind the cancelled waiter


@pytest.mark.integration
def test_a_failing_upstream_fails_one_request_and_the_queue_goes_on(remote, fake):
    """A 500 becomes Failed for that request; the next request still streams."""
    scheduler = ConcurrentScheduler(remote, max_running=1)
    try:
        fake.fail_with = 500
        failed = Events()
        scheduler.submit(remote.request(COUNT, max_new_tokens=4), failed)
        assert "HTTP 500" in failed.wait(Failed).error
        fake.fail_with = None
        ok = Events()
        scheduler.submit(remote.request(COUNT, max_new_tokens=4), ok)
        assert ok.wait(Finished).result.new_tokens == 4
    finally:
        fake.fail_with = None
        scheduler.close()


@pytest.mark.integration
@pytest.mark.django_db
def test_healthz_names_the_remote_backend_and_reports_an_unreachable_upstream_as_degraded(
    settings, monkeypatch, runtime, backend
):
    """/healthz says which backend and model serve; an upstream that does not answer is "degraded", not "ok"."""
    down = OpenAIBackend(
        RemoteConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", model="served-model"),
        tokenizer=backend.tokenizer,
    )
    settings.CHAT_BACKEND, settings.CHAT_REMOTE_URL = "openai", down.config.base_url
    monkeypatch.setattr(runtime, "backend", down)
    from django.test import Client

    response = Client().get("/healthz")
    report = response.json()
    assert response.status_code == 200 and report["status"] == "degraded"
    assert report["backend"] == "openai" and report["model_name"] == "served-model"
    assert report["upstream_status"] == "unavailable"
    assert "upstream" not in report and down.config.base_url not in response.content.decode()


@pytest.mark.unit
def test_events_that_arrive_together_are_handed_on_as_one_piece_and_split_lines_join():
    """The relay parses what one read brought together and hands its text on once (one event
    per token costs the web process a hand-off each); a line split across reads still parses."""
    import json

    def event(text: str | None, finish: str | None = None) -> bytes:
        delta = {"content": text} if text is not None else {}
        body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(body)}\r\n\r\n".encode()

    together = event("Hello") + event(", ") + event("world")
    split = event("!") + event(None, "stop") + b"data: [DONE]\n\n"

    with closing_upstream([together, split[:9], split[9:]]) as base_url:
        remote = OpenAIBackend(RemoteConfig(base_url=base_url, model="m"))
        pieces: list[str] = []
        result = remote.generate(remote.request(COUNT, max_new_tokens=8), pieces.append)
    assert pieces == ["Hello, world", "!"]
    assert result.text == "Hello, world!" and result.finish_reason == "eos"
    assert result.new_tokens == 4  # one per event that carried text, without a usage
