"""The chat over HTTP (SSE and JSON) against the real ASGI application, model and Redis."""

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import ApplicationCommunicator
from django.utils.crypto import get_random_string

from chat.models import Conversation, Message
from tests.conftest import chunks_text
from tests.test_consumer import LONG, SHORT, new_session_key, wait_stored

pytestmark = pytest.mark.django_db(transaction=True)


class HttpVisitor:
    """A visitor (session + CSRF cookie) speaking HTTP to the ASGI application, as daphne would."""

    def __init__(self, application, session_key: str, *, csrf: bool = True):
        self.application = application
        self.session_key = session_key
        self.token = get_random_string(32)
        self.csrf = csrf

    def scope(self, path: str) -> dict:
        headers = [
            (b"host", b"localhost"),
            (b"content-type", b"application/json"),
            (b"cookie", f"sessionid={self.session_key}; csrftoken={self.token}".encode()),
        ]
        if self.csrf:
            headers.append((b"x-csrftoken", self.token.encode()))
        return {
            "type": "http",
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("localhost", 80),
        }

    async def open(self, path: str, body) -> "HttpResponseReader":
        """Send the request; returns a reader positioned after the response's status and headers."""
        communicator = ApplicationCommunicator(self.application, self.scope(path))
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        await communicator.send_input({"type": "http.request", "body": raw, "more_body": False})
        start = await communicator.receive_output(timeout=60)
        assert start["type"] == "http.response.start"
        return HttpResponseReader(communicator, start)

    async def post(self, path: str, body) -> tuple[int, dict | str, dict]:
        """The whole response: status, body (JSON when it is), headers."""
        reader = await self.open(path, body)
        text = await reader.read_all()
        try:
            payload = json.loads(text)
        except ValueError:
            payload = text
        return reader.status, payload, reader.headers


class HttpResponseReader:
    def __init__(self, communicator: ApplicationCommunicator, start: dict):
        self.communicator = communicator
        self.status = start["status"]
        self.headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
        self.buffer = ""
        self.ended = False

    async def read_body(self) -> str:
        message = await self.communicator.receive_output(timeout=120)
        assert message["type"] == "http.response.body"
        self.ended = not message.get("more_body", False)
        return message.get("body", b"").decode()

    async def read_all(self) -> str:
        text = ""
        while not self.ended:
            text += await self.read_body()
        await self.communicator.wait(timeout=5)
        return text

    async def events(self):
        """Server-sent events as they arrive (only `data:` lines; comments are keep-alives)."""
        while True:
            while "\n\n" in self.buffer:
                block, self.buffer = self.buffer.split("\n\n", 1)
                data = [
                    line[len("data: ") :]
                    for line in block.splitlines()
                    if line.startswith("data: ")
                ]
                if data:
                    yield json.loads("\n".join(data))
            if self.ended:
                return
            self.buffer += await self.read_body()

    async def disconnect(self):
        """The client closes the connection mid-stream."""
        await self.communicator.send_input({"type": "http.disconnect"})
        await self.communicator.wait(timeout=10)


@pytest.fixture
async def visitor(application):
    return HttpVisitor(application, await new_session_key())


@pytest.mark.integration
async def test_sse_stream_sends_protocol_events_whose_chunks_assemble_to_the_stored_text(visitor):
    """POST /api/chat/stream: text/event-stream, accepted, chunks, done; chunks joined == done.text == stored."""
    reader = await visitor.open("/api/chat/stream", {"text": SHORT})
    assert reader.status == 200 and reader.headers["content-type"].startswith("text/event-stream")
    events = [event async for event in reader.events()]
    await reader.communicator.wait(timeout=5)
    accepted, done = events[0], events[-1]
    assert (
        accepted["type"] == "accepted"
        and accepted["request_id"].startswith("http-")
        and accepted["message"]
    )
    assert [e["type"] for e in events[1:-1]] == ["chunk"] * (len(events) - 2) and len(events) > 3
    assert (
        done["type"] == "done"
        and done["finish_reason"] in ("eos", "length")
        and done["request_id"] == accepted["request_id"]
    )
    assert chunks_text(events) == done["text"] and done["text"].strip()
    message = await sync_to_async(Message.objects.get)(pk=done["message"])
    assert message.text == done["text"] and message.status == "done"


@pytest.mark.integration
async def test_post_api_chat_returns_the_done_event_as_json(visitor):
    """POST /api/chat answers the final `done` event, with the client's request_id when it gave one."""
    status, done, headers = await visitor.post("/api/chat", {"text": SHORT, "request_id": "mine"})
    assert status == 200 and headers["content-type"] == "application/json"
    assert (
        done["type"] == "done"
        and done["request_id"] == "mine"
        and done["finish_reason"] in ("eos", "length")
    )
    assert done["text"].strip() and done["cached"] is False
    message = await sync_to_async(Message.objects.get)(pk=done["message"])
    assert message.text == done["text"]


@pytest.mark.integration
@pytest.mark.parametrize("path", ["/api/chat", "/api/chat/stream"])
@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "bad_json"),
        (b"[1, 2]", "bad_frame"),
        ({"text": "   "}, "bad_prompt"),
        ({"text": "hi", "conversation": "seven"}, "bad_conversation"),
        ({"text": "hi", "policy": 3}, "bad_policy"),
        ({"type": "cancel", "text": "hi"}, "unknown_type"),
        ({"text": "x" * 40_000}, "prompt_too_long"),
    ],
)
async def test_a_bad_body_is_a_400_with_the_error_event(visitor, path, body, code):
    """A body the server will not act on gets 400 and a JSON `error` event with a code, never a trace."""
    status, error, _ = await visitor.post(path, body)
    assert status == 400 and error["type"] == "error" and error["code"] == code and error["message"]
    assert await sync_to_async(Message.objects.count)() == 0


@pytest.mark.integration
async def test_someone_elses_conversation_is_a_404(visitor, application):
    """Continuing a conversation of another visitor is refused as if it did not exist."""
    other = await new_session_key()
    conversation = await sync_to_async(Conversation.objects.create)(
        session_key=other, title="private"
    )
    status, error, _ = await visitor.post(
        "/api/chat", {"text": "hi", "conversation": conversation.pk}
    )
    assert status == 404 and error["code"] == "unknown_conversation"
    assert await sync_to_async(Message.objects.filter(conversation=conversation).count)() == 0


@pytest.mark.integration
async def test_without_the_csrf_token_a_post_is_forbidden(application):
    """CSRF protection stays on for the API: cookie without the X-CSRFToken header -> 403, nothing runs."""
    session_key = await new_session_key()
    for path in ("/api/chat", "/api/chat/stream", "/api/chat/cancel"):
        status, error, _ = await HttpVisitor(application, session_key, csrf=False).post(
            path, {"text": SHORT, "message": 1}
        )
        assert (
            status == 403 and error["code"] == "csrf_failed" and "X-CSRFToken" in error["message"]
        )
    assert await sync_to_async(Message.objects.count)() == 0


@pytest.mark.unit
async def test_the_csrf_endpoint_sets_the_cookie_and_returns_the_token():
    """GET /api/csrf gives an API client a session and the token to send back in X-CSRFToken."""
    from django.test import AsyncClient

    client = AsyncClient(enforce_csrf_checks=True)
    response = await client.get("/api/csrf")
    token = response.json()["csrf_token"]
    assert token and "csrftoken" in response.cookies and "sessionid" in response.cookies
    refused = await client.post("/api/chat", {"text": "  "}, content_type="application/json")
    accepted = await client.post(
        "/api/chat", {"text": "  "}, content_type="application/json", headers={"X-CSRFToken": token}
    )
    assert (
        refused.status_code == 403
        and accepted.status_code == 400
        and accepted.json()["code"] == "bad_prompt"
    )


@pytest.mark.integration
async def test_over_the_rate_limit_the_api_answers_429(visitor, monkeypatch):
    """The socket's per-user limit applies to HTTP too (one limiter): 429, Retry-After, code rate_limited."""
    from chat.infra import ratelimit

    monkeypatch.setattr(ratelimit.prompt_limiter, "limit", 1)
    ratelimit.prompt_limiter.check(
        f"session:{visitor.session_key}"
    )  # the visitor's one prompt this minute
    status, error, headers = await visitor.post("/api/chat/stream", {"text": SHORT})
    assert status == 429 and error["code"] == "rate_limited" and headers["retry-after"]


@pytest.mark.integration
async def test_closing_the_sse_stream_cancels_the_generation(visitor, settings):
    """A client that drops the SSE connection stops its turn, like a closed tab, once the grace
    period (here none) passed; the partial answer is stored."""
    settings.CHAT_RESUME_GRACE_S = 0
    reader = await visitor.open("/api/chat/stream", {"text": LONG})
    events = reader.events()
    accepted = await events.__anext__()
    while (await events.__anext__())["type"] != "chunk":
        pass
    await reader.disconnect()
    message = await wait_stored(accepted["message"])
    assert message.status == "cancelled" and message.finish_reason == "cancelled"


@pytest.mark.integration
async def test_leaving_post_api_chat_before_the_answer_cancels_it(visitor):
    """POST /api/chat has no stream to close, but a client that disconnects while waiting still stops its turn."""
    communicator = ApplicationCommunicator(visitor.application, visitor.scope("/api/chat"))
    await communicator.send_input(
        {"type": "http.request", "body": json.dumps({"text": LONG}).encode()}
    )
    answers = Message.objects.filter(
        conversation__session_key=visitor.session_key, role="assistant"
    )
    for _ in range(600):
        answer = await sync_to_async(answers.first)()
        if answer is not None:
            break
        await asyncio.sleep(0.05)
    assert answer is not None, "the turn never started"
    await communicator.send_input({"type": "http.disconnect"})
    await communicator.wait(timeout=10)
    message = await wait_stored(answer.pk)
    assert message.status == "cancelled" and message.finish_reason == "cancelled"


@pytest.mark.integration
async def test_cancel_endpoint_stops_the_visitors_running_answer(visitor, make_client):
    """POST /api/chat/cancel with the message id stops an answer started on the visitor's socket."""
    chat = await make_client(session_key=visitor.session_key)
    request_id = await chat.prompt(LONG)
    accepted = await chat.receive()
    await chat.receive_until("chunk", request_id)
    status, ack, _ = await visitor.post("/api/chat/cancel", {"message": accepted["message"]})
    assert status == 200 and ack == {
        "type": "cancel_ack",
        "request_id": None,
        "message": accepted["message"],
        "result": "cancelled",
    }
    done = (await chat.receive_until("done", request_id))[-1]
    assert done["finish_reason"] == "cancelled"
    status, ack, _ = await visitor.post("/api/chat/cancel", {"message": accepted["message"]})
    assert status == 200 and ack["result"] == "finished"  # a late Stop is harmless


@pytest.mark.integration
async def test_cancel_endpoint_refuses_other_visitors_and_unknown_answers(visitor, make_client):
    """Another visitor's answer, a user message or an unknown id: 404 unknown_request; the answer goes on."""
    chat = await make_client()
    request_id = await chat.prompt(SHORT)
    accepted = await chat.receive()
    for message_id in (accepted["message"], accepted["message"] - 1, 10**9):
        status, error, _ = await visitor.post("/api/chat/cancel", {"message": message_id})
        assert status == 404 and error["code"] == "unknown_request"
    status, error, _ = await visitor.post("/api/chat/cancel", {"message": "one"})
    assert status == 400 and error["code"] == "bad_message"
    assert (await chat.receive_until("done", request_id))[-1]["finish_reason"] in ("eos", "length")


@pytest.mark.integration
async def test_an_answer_cut_off_over_http_is_continued_over_http(visitor, make_policy):
    """`{"type": "continue", "message": id}` as the body: the rest goes into the same message;
    an answer that is no longer the last one is a 400 `bad_message`."""
    await sync_to_async(make_policy)(slug="tiny", max_new_tokens=4)
    status, first, _ = await visitor.post(
        "/api/chat", {"text": "Write a long story about a fox in a forest.", "policy": "tiny"}
    )
    assert status == 200 and first["finish_reason"] == "length", first
    reader = await visitor.open(
        "/api/chat/stream", {"type": "continue", "message": first["message"]}
    )
    events = [event async for event in reader.events()]
    done = events[-1]
    assert events[0]["message"] == done["message"] == first["message"]
    assert done["text"] == first["text"] + chunks_text(events)
    assert len(done["text"]) > len(first["text"])
    conversation = events[0]["conversation"]
    await visitor.post(
        "/api/chat", {"text": "Thanks!", "conversation": conversation, "policy": "tiny"}
    )
    status, error, _ = await visitor.post(
        "/api/chat", {"type": "continue", "message": first["message"]}
    )
    assert status == 400 and error["code"] == "bad_message"  # no longer the last answer


@pytest.mark.unit
async def test_the_feed_hands_on_what_was_queued_together_at_once_and_keeps_a_quiet_stream_alive(
    monkeypatch,
):
    """A response writes whatever its turn queued meanwhile in one go (one write through the
    server's layers, not one per token), and a stream with nothing to say gets a keep-alive."""
    from chat.protocol import events
    from chat.transports import feed as feed_module

    monkeypatch.setattr(feed_module, "KEEPALIVE_SECONDS", 0.05)
    feed = feed_module.TurnFeed()
    batches = feed.batches_until_end()
    chunks = [events.Chunk("r", text) for text in ("a", "b", "c")]
    for chunk in chunks:
        await feed.send(chunk)
    assert await anext(batches) == chunks
    assert await anext(batches) == [feed_module.KEEPALIVE]  # quiet since: kept alive
    await feed.send(chunks[0])
    feed.events.put_nowait(feed.END)
    assert await anext(batches) == [chunks[0]]
    with pytest.raises(StopAsyncIteration):
        await anext(batches)
