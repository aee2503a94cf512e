"""The remote backend read on the event loop (`agenerate`, loop_stream.py), and the remote
scheduler running it as a task there: against loopback OpenAI-compatible servers, over real
sockets, each answer compared with what the blocking path does."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chat.engine.remote.concurrent import ConcurrentScheduler
from chat.engine.remote.openai_backend import OpenAIBackend, RemoteConfig
from chat.engine.types import (
    EngineError,
    EngineUnavailable,
    Failed,
    Finished,
    PromptTooLong,
    Started,
    TextChunk,
)
from chat.turns.inbox import ChunkQueue, EventInbox
from harness.liveserver import free_port
from harness.openai_server import FakeOpenAIServer, closing_upstream
from tests.test_remote import COUNT, STORY, remote_for


@pytest.fixture(scope="module")
def fake(backend):
    server = FakeOpenAIServer(backend).start()
    yield server
    server.stop()


@pytest.fixture
def remote(fake, backend):
    return remote_for(fake, backend)


async def until(predicate, timeout: float = 120) -> None:
    """Let the loop run until `predicate` holds (a hang guard, not a timed assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.integration
async def test_the_loop_reads_the_real_models_answer_on_the_loops_own_thread(remote, fake):
    """The same answer, usage and end as the blocking read, its text handed on by the loop's
    own thread (no reader thread) in the pieces that arrived."""
    threads: set[int] = set()
    chunks: list[str] = []

    def on_text(text: str) -> None:
        chunks.append(text)
        threads.add(threading.get_ident())

    result = await remote.agenerate(remote.request(COUNT, max_new_tokens=40), on_text)
    served = fake.served[-1]
    blocking = await asyncio.to_thread(remote.generate, remote.request(COUNT, max_new_tokens=40))
    assert len(chunks) > 3 and "".join(chunks) == result.text == blocking.text
    assert result.finish_reason == blocking.finish_reason
    assert (result.new_tokens, result.prompt_tokens) == (served.new_tokens, served.prompt_tokens)
    assert threads == {threading.get_ident()}
    assert served.body["stream"] is True and result.first_token_at is not None


async def _stalled_after_first_token(remote):
    """A long answer streaming as a task on this loop, its first token in (the fake server then
    goes quiet when told to): its request and task."""
    request = remote.request(STORY, max_new_tokens=300)
    first = asyncio.Event()
    task = asyncio.create_task(remote.agenerate(request, lambda _text: first.set()))
    await asyncio.wait_for(first.wait(), 120)
    return request, task


@pytest.mark.integration
async def test_cancelling_the_task_closes_the_upstream_at_once(remote, fake):
    """The server has gone quiet after one token: cancelling the task (as the scheduler's cancel
    does) closes the socket under the wait, well before the once-a-second look at the flag."""
    fake.stall_after_first_chunk = True
    try:
        request, task = await _stalled_after_first_token(remote)
        served = fake.served[-1]
        request.cancel.set()
        cancelled_at = time.perf_counter()
        task.cancel()
        result = await asyncio.wait_for(task, 30)
        await until(lambda: served.client_gone_at is not None)
    finally:
        fake.stall_after_first_chunk = False
    assert result.finish_reason == "cancelled" and result.text
    assert served.client_gone_at - cancelled_at < 0.5
    await until(served.done.is_set)
    assert served.finish_reason == "cancelled" and served.new_tokens < 300


@pytest.mark.integration
async def test_a_cancel_flag_alone_closes_a_silent_upstream(remote, fake):
    """Nobody cancels the task, only the request's flag: the stream still hangs up and ends as
    cancelled (its look at the flag, once a second)."""
    fake.stall_after_first_chunk = True
    try:
        request, task = await _stalled_after_first_token(remote)
        request.cancel.set()
        result = await asyncio.wait_for(task, 30)
    finally:
        fake.stall_after_first_chunk = False
    served = fake.served[-1]
    await until(lambda: served.client_gone_at is not None)
    assert result.finish_reason == "cancelled"


async def both_errors(remote: OpenAIBackend, messages, **options) -> tuple[Exception, Exception]:
    """What the blocking read and the loop raise for the same request."""
    with pytest.raises(EngineError) as blocking:
        await asyncio.to_thread(remote.generate, remote.request(messages, **options))
    with pytest.raises(EngineError) as on_loop:
        await remote.agenerate(remote.request(messages, **options))
    return blocking.value, on_loop.value


@pytest.mark.integration
async def test_upstream_errors_are_the_same_clear_errors_on_the_loop(remote, fake, backend):
    """A 500, a malformed event, a context-length refusal and a server that is not there read
    exactly as they do on the blocking path."""
    fake.fail_with = 500
    try:
        blocking, on_loop = await both_errors(remote, COUNT, max_new_tokens=8)
    finally:
        fake.fail_with = None
    assert type(on_loop) is type(blocking) is EngineError and str(on_loop) == str(blocking)
    assert "HTTP 500" in str(on_loop) and "the engine died" in str(on_loop)

    fake.garbage = b"{not json"
    try:
        blocking, on_loop = await both_errors(remote, COUNT, max_new_tokens=8)
    finally:
        fake.garbage = None
    assert str(on_loop) == str(blocking) and "malformed event" in str(on_loop)

    small = remote_for(fake, backend, context_length=1 << 20)  # refused by the server, not here
    long = [{"role": "user", "content": "dragon " * (backend.context_length + 10)}]
    blocking, on_loop = await both_errors(small, long, max_new_tokens=8)
    assert type(on_loop) is type(blocking) is PromptTooLong and str(on_loop) == str(blocking)

    down = OpenAIBackend(RemoteConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m"))
    blocking, on_loop = await both_errors(down, COUNT, max_new_tokens=8)
    assert type(on_loop) is type(blocking) is EngineUnavailable and str(on_loop) == str(blocking)
    assert "refused the connection" in str(on_loop)


@pytest.mark.integration
async def test_a_refused_field_is_dropped_and_the_request_sent_once_more_on_the_loop(backend):
    """A 422 naming an optional field: learnt, and the same request sent again without it."""
    strict = FakeOpenAIServer(backend, refuse_fields=frozenset({"min_tokens"})).start()
    try:
        remote = remote_for(strict, backend)
        result = await remote.agenerate(remote.request(COUNT, max_new_tokens=12, min_new_tokens=2))
    finally:
        strict.stop()
    assert strict.posts == 2 and "min_tokens" in strict.refused[0]
    assert "min_tokens" not in strict.served[-1].body and result.text
    assert "min_tokens" in remote.capabilities.refused


def scripted_upstream(parts: list[bytes], seen: dict) -> ThreadingHTTPServer:
    """An HTTP/1.1 server writing `parts` of one chunked body apart (each its own read), and
    noting whether the client hung up before the last."""

    class Upstream(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            seen["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for part in parts:
                    self.wfile.write(part)
                    self.wfile.flush()
                    time.sleep(0.15)
            except OSError:
                seen["hung_up"] = True
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def event(text: str | None, finish: str | None = None) -> bytes:
    delta = {"content": text} if text is not None else {}
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.mark.unit
async def test_a_stop_string_split_across_events_and_reads_is_held_back_on_the_loop():
    """ "STOP" arrives as "ST" at the end of one event and "OP" at the start of the next, read
    apart, over a chunked body whose framing is split mid-size-line and mid-chunk: neither half
    is ever shown, the answer ends as stop_string, and the relay hangs up on the rest."""
    first, second = chunked(event("Hello wor") + event("ld. ST")), chunked(event("OP and more"))
    parts = [first[:1], first[1:40], first[40:], second, chunked(event("x")) * 50, b"0\r\n\r\n"]
    seen: dict = {}
    server = scripted_upstream(parts, seen)
    try:
        remote = OpenAIBackend(
            RemoteConfig(base_url=f"http://127.0.0.1:{server.server_port}/v1", model="m")
        )
        pieces: list[str] = []
        request = remote.request(COUNT, max_new_tokens=64, stop_strings=("STOP",))
        result = await remote.agenerate(request, pieces.append)
        await until(lambda: seen.get("hung_up"), timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    assert seen["body"]["stop"] == ["STOP"]
    assert "".join(pieces) == result.text == "Hello world. "
    assert not any("S" in piece for piece in pieces)
    assert result.finish_reason == "stop_string"


@pytest.mark.unit
async def test_events_made_on_the_loops_thread_are_in_the_queue_at_once_and_chunks_join():
    """On the loop's thread the inbox puts at once (nothing waits for a turn of the loop), and a
    chunk behind a chunk not yet taken joins it; another thread's events still arrive in order,
    on the next wake-up, joined the same way."""
    queue = ChunkQueue()
    inbox = EventInbox(asyncio.get_running_loop(), queue)
    inbox.sink(Started(at=1.0))
    inbox.sink(TextChunk("Hel"))
    inbox.sink(TextChunk("lo"))
    assert queue.qsize() == 2
    assert queue.get_nowait() == Started(at=1.0) and queue.get_nowait() == TextChunk("Hello")

    def elsewhere() -> None:
        for text in (", ", "world"):
            inbox.sink(TextChunk(text))
        inbox.sink(Failed("gone", at=2.0))

    worker = threading.Thread(target=elsewhere)
    worker.start()
    worker.join()
    assert queue.qsize() == 0  # handed to the loop, not yet delivered
    assert await queue.get() == TextChunk(", world")
    assert queue.get_nowait() == Failed("gone", at=2.0)


@pytest.mark.integration
async def test_the_scheduler_streams_on_the_loop_without_threads_and_keeps_its_queue(remote, fake):
    """Submitted from a running loop: each stream is a task there, its events come on the
    loop's thread, one slot still means one at a time in order, and a cancel of the running one
    closes its upstream."""
    scheduler = ConcurrentScheduler(remote, max_running=1)
    loop_thread = threading.get_ident()
    seen: dict[str, list] = {"a": [], "b": [], "c": []}

    def sink_for(name: str):
        return lambda event: seen[name].append((event, threading.get_ident()))

    def ended(name: str) -> bool:
        return any(isinstance(e, (Finished, Failed)) for e, _ in seen[name])

    threads_before = set(threading.enumerate())
    try:
        a, at_a = scheduler.submit(remote.request(COUNT, max_new_tokens=20), sink_for("a"))
        b, at_b = scheduler.submit(remote.request(COUNT, max_new_tokens=10), sink_for("b"))
        assert (at_a, at_b) == (0, 1) and a.task is not None and b.task is None
        await until(lambda: ended("a") and ended("b"))
        assert b.task is not None
        assert {thread for name in "ab" for _, thread in seen[name]} == {loop_thread}
        started = set(threading.enumerate()) - threads_before
        assert not [t.name for t in started if t.name.startswith("remote-")]
        finish_a = next(e for e, _ in seen["a"] if isinstance(e, Finished))
        start_b = next(e for e, _ in seen["b"] if isinstance(e, Started))
        assert start_b.at > finish_a.result.finished_at

        c, _ = scheduler.submit(remote.request(STORY, max_new_tokens=300), sink_for("c"))
        await until(lambda: any(isinstance(e, TextChunk) for e, _ in seen["c"]))
        served = fake.served[-1]
        scheduler.cancel(c)
        await until(lambda: ended("c"))
        await until(lambda: served.client_gone_at is not None)
    finally:
        scheduler.close()
    finished = next(e for e, _ in seen["c"] if isinstance(e, Finished))
    assert finished.result.finish_reason == "cancelled" and scheduler.running == 0


@pytest.mark.integration
async def test_a_stream_cancelled_before_its_task_began_still_ends_and_gives_its_slot_back(remote):
    """Cancelled in the same turn of the loop it was submitted in: it ends as cancelled and its
    slot goes to the next request, which streams."""
    scheduler = ConcurrentScheduler(remote, max_running=1)
    first: list = []
    second: list = []
    try:
        ticket, _ = scheduler.submit(remote.request(COUNT, max_new_tokens=8), first.append)
        _, position = scheduler.submit(remote.request(COUNT, max_new_tokens=8), second.append)
        scheduler.cancel(ticket)
        await until(lambda: any(isinstance(e, (Finished, Failed)) for e in second), timeout=60)
    finally:
        scheduler.close()
    assert position == 1 and [type(e) for e in first] == [Finished]
    assert first[0].result.finish_reason == "cancelled"
    assert next(e for e in second if isinstance(e, Finished)).result.text


@pytest.mark.unit
async def test_events_read_together_are_one_piece_on_the_loop_and_a_body_to_the_close_ends_it():
    """An HTTP/1.0 answer whose body lasts until the server closes (no length, not chunked):
    the events of one read go on as one piece, a line split across reads still parses, and the
    close after [DONE] ends the answer."""

    def plain(text: str | None, finish: str | None = None) -> bytes:
        return event(text, finish).replace(b"\n\n", b"\r\n\r\n")

    together = plain("Hello") + plain(", ") + plain("world")
    split = plain("!") + plain(None, "stop") + b"data: [DONE]\n\n"

    with closing_upstream([together, split[:9], split[9:]]) as base_url:
        remote = OpenAIBackend(RemoteConfig(base_url=base_url, model="m"))
        pieces: list[str] = []
        result = await remote.agenerate(remote.request(COUNT, max_new_tokens=8), pieces.append)
    assert pieces == ["Hello, world", "!"]
    assert result.text == "Hello, world!" and result.finish_reason == "eos"
    assert result.new_tokens == 4
