"""The WebSocket protocol against the real ASGI application, model and Redis."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.contrib.sessions.backends.db import SessionStore
from django.db import OperationalError

from chat.models import Message
from tests.conftest import chunks_text

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SHORT = "Count from 1 to 10, separated by commas."
LONG = "Write a very long story about a dragon who learns to bake bread."


async def stored(message_id: int) -> Message:
    """The message as stored now. The suite's in-memory SQLite shares one cache between
    connections, which locks a table for a reader while another connection writes it (a running
    answer's save): "database table is locked" is retried here. A database file in WAL mode, as
    served, never refuses a reader."""
    for attempt in range(20):
        try:
            return await sync_to_async(Message.objects.get)(pk=message_id)
        except OperationalError as exc:
            if "locked" not in str(exc) or attempt == 19:
                raise
            await asyncio.sleep(0.05)
    raise AssertionError("unreachable")


async def wait_stored(message_id: int, timeout: float = 60) -> Message:
    """The message once its answer has ended (a turn is stored even after its socket closed)."""
    for _ in range(int(timeout * 20)):
        message = await stored(message_id)
        if message.status != Message.Status.STREAMING:
            return message
        await asyncio.sleep(0.05)
    raise AssertionError(f"message {message_id} still streaming")


async def new_session_key() -> str:
    session = SessionStore()
    await sync_to_async(session.create)()
    return session.session_key


async def test_prompt_streams_chunks_that_assemble_to_the_stored_text(client, settings):
    """accepted, then chunks, then done; chunks joined equal done.text and the stored message."""
    request_id = await client.prompt(SHORT)
    events = await client.receive_until("done", request_id)
    accepted, done = events[0], events[-1]
    assert accepted["type"] == "accepted" and accepted["request_id"] == request_id
    assert accepted["queue_position"] == 0 and accepted["conversation"] and accepted["message"]
    assert [e["type"] for e in events[1:-1]] == ["chunk"] * (len(events) - 2)
    assert len(events) > 3
    assert chunks_text(events) == done["text"]
    assert done["text"].strip()  # some answer; its greedy wording is the model's business
    assert (
        done["finish_reason"] in ("eos", "length")
        and done["cached"] is False
        and done["json"] is None
    )
    assert set(done["metrics"]) >= {"queue_ms", "ttft_ms", "total_ms", "new_tokens", "tokens_per_s"}
    assert 0 < done["metrics"]["ttft_ms"] <= done["metrics"]["total_ms"]
    message = await stored(done["message"])
    assert (
        message.text == done["text"]
        and message.status == "done"
        and message.finish_reason == done["finish_reason"]
    )
    assert (
        message.instance == settings.CHAT_INSTANCE
    )  # the process a restart sweep would answer for
    assert message.metrics["new_tokens"] == done["metrics"]["new_tokens"]
    assert await client.communicator.receive_nothing(timeout=0.2)


async def test_follow_up_prompt_is_answered_with_the_conversation_as_context(client, settings):
    """A prompt naming its conversation continues it, and the model input holds the earlier turns."""
    settings.CHAT_MAX_NEW_TOKENS = 20
    first = await client.prompt("My name is Ada. Reply with one short greeting.")
    events = await client.receive_until("done", first)
    conversation, first_done = events[0]["conversation"], events[-1]
    second = await client.prompt("What is my name?", conversation=conversation)
    events = await client.receive_until("done", second)
    assert events[0]["conversation"] == conversation
    first_input = first_done["metrics"]["prompt_tokens"]
    # The second input is the first prompt, its answer and the new question, not the question alone.
    assert (
        events[-1]["metrics"]["prompt_tokens"] > first_input + first_done["metrics"]["new_tokens"]
    )
    roles = await sync_to_async(list)(
        Message.objects.filter(conversation_id=conversation).values_list("role", flat=True)
    )
    assert roles == ["user", "assistant", "user", "assistant"]


async def test_ping_gets_pong(client):
    """A ping is answered at once, even with no request."""
    await client.send({"type": "ping"})
    assert await client.receive() == {"type": "pong"}


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("not json", "bad_json"),
        ("[1, 2]", "bad_frame"),
        ('{"type": "dance"}', "unknown_type"),
        ('{"no": "type"}', "unknown_type"),
        ('{"type": "prompt", "text": "hi"}', "bad_request_id"),
        ('{"type": "prompt", "request_id": 7, "text": "hi"}', "bad_request_id"),
        ('{"type": "prompt", "request_id": "a", "text": 5}', "bad_prompt"),
        ('{"type": "prompt", "request_id": "a", "text": "   "}', "bad_prompt"),
        (
            '{"type": "prompt", "request_id": "a", "text": "hi", "conversation": "x"}',
            "bad_conversation",
        ),
        (
            '{"type": "prompt", "request_id": "a", "text": "hi", "conversation": true}',
            "bad_conversation",
        ),
        ('{"type": "prompt", "request_id": "a", "text": "hi", "policy": 3}', "bad_policy"),
        ('{"type": "cancel"}', "bad_request_id"),
        ('{"type": "cancel", "request_id": "never-sent"}', "unknown_request"),
        (
            '{"type": "prompt", "request_id": "a", "text": "hi", "conversation": 999999}',
            "unknown_conversation",
        ),
    ],
)
async def test_every_bad_frame_gets_an_error_and_the_socket_stays_usable(client, raw, code):
    """Each malformed frame is answered with an `error` carrying a code; ping still works after."""
    await client.communicator.send_to(text_data=raw)
    error = await client.receive()
    assert error["type"] == "error" and error["code"] == code and error["message"]
    await client.send({"type": "ping"})
    assert await client.receive() == {"type": "pong"}


async def test_binary_and_oversized_frames_are_refused_with_an_error(client, settings):
    """Binary frames and prompts over the character limit are errors, not crashes."""
    await client.communicator.send_to(bytes_data=b"\x00\x01")
    assert (await client.receive())["code"] == "binary_frame"
    settings.CHAT_MAX_PROMPT_CHARS = 50
    await client.prompt("x" * 51, request_id="big")
    error = await client.receive()
    assert (error["code"], error["request_id"]) == ("prompt_too_long", "big")
    assert "51 characters" in error["message"]
    await client.send({"type": "ping"})
    assert await client.receive() == {"type": "pong"}


async def test_second_prompt_while_one_runs_is_refused(client):
    """One running answer per connection: a second prompt gets `busy`, the first goes on."""
    first = await client.prompt(LONG)
    assert (await client.receive())["type"] == "accepted"
    await client.prompt("Hello", request_id="second")
    events = await client.receive_until("error", "second")
    assert events[-1]["code"] == "busy"
    await client.send({"type": "cancel", "request_id": first})
    done = (await client.receive_until("done", first))[-1]
    assert done["finish_reason"] == "cancelled"


async def test_reused_request_id_is_refused(client):
    """request_id is unique per connection."""
    request_id = await client.prompt(SHORT, request_id="same")
    await client.receive_until("done", request_id)
    await client.prompt(SHORT, request_id="same")
    assert (await client.receive())["code"] == "duplicate_request_id"


async def test_cancel_mid_stream_stops_and_stores_the_partial_answer(client):
    """Stop ends the answer within a step; the partial text is stored, marked cancelled."""
    request_id = await client.prompt(LONG)
    events = await client.receive_until("chunk", request_id)
    await client.send({"type": "cancel", "request_id": request_id})
    events += await client.receive_until("done", request_id)
    done = events[-1]
    assert done["finish_reason"] == "cancelled"
    assert chunks_text(events) == done["text"] and done["text"]
    assert done["metrics"]["new_tokens"] < 100
    message = await stored(done["message"])
    assert (message.status, message.finish_reason, message.text) == (
        "cancelled",
        "cancelled",
        done["text"],
    )


async def test_closed_socket_cancels_the_generation(make_client, settings):
    """Without a grace period a closed tab stops its answer at once; the message is stored as
    cancelled (tests/test_resume.py has the grace period)."""
    settings.CHAT_RESUME_GRACE_S = 0
    client = await make_client()
    request_id = await client.prompt(LONG)
    events = await client.receive_until("chunk", request_id)
    await client.close()
    message = await wait_stored(events[0]["message"])
    assert message.status == "cancelled" and message.finish_reason == "cancelled"
    assert message.metrics["new_tokens"] < 100


async def test_queued_request_is_served_as_soon_as_the_one_before_is_cancelled(
    make_client, runtime, monkeypatch
):
    """With the batch full (one row), a second user waits at position 1 and starts right after
    the first is cancelled."""
    monkeypatch.setattr(runtime.scheduler, "max_batch", 1)
    alice, bob = await make_client(), await make_client()
    a = await alice.prompt(LONG)
    await alice.receive_until("chunk", a)
    b = await bob.prompt(SHORT)
    accepted = await bob.receive()
    assert accepted["type"] == "accepted" and accepted["queue_position"] == 1
    await alice.send({"type": "cancel", "request_id": a})
    assert (await alice.receive_until("done", a))[-1]["finish_reason"] == "cancelled"
    events = await bob.receive_until("done", b)
    assert (
        events[-1]["finish_reason"] in ("eos", "length")
        and chunks_text(events) == events[-1]["text"]
    )


async def test_cancelling_a_waiting_request_removes_it_from_the_queue(
    make_client, runtime, monkeypatch
):
    """A request cancelled while queued (the batch full) never runs and frees its place for the next."""
    monkeypatch.setattr(runtime.scheduler, "max_batch", 1)
    alice, bob, carol = await make_client(), await make_client(), await make_client()
    a = await alice.prompt(LONG)
    await alice.receive_until("chunk", a)
    b = await bob.prompt(SHORT)
    assert (await bob.receive())["queue_position"] == 1
    # Not bob's prompt: an identical one would share his generation (engine/sharing/coalescing.py).
    c = await carol.prompt("Count from 1 to 5, separated by commas.")
    assert (await carol.receive())["queue_position"] == 2
    await bob.send({"type": "cancel", "request_id": b})
    done = (await bob.receive_until("done", b))[-1]
    assert (
        done["finish_reason"] == "cancelled"
        and done["metrics"]["new_tokens"] == 0
        and done["text"] == ""
    )
    moved = await carol.receive()
    moved.pop("seq")  # its number in carol's answer (tests/test_resume.py)
    assert moved == {"type": "queued", "request_id": c, "queue_position": 1}
    await alice.send({"type": "cancel", "request_id": a})
    assert (await carol.receive_until("done", c))[-1]["finish_reason"] in ("eos", "length")


async def test_max_new_tokens_ends_with_length(client, settings):
    """The server's max_new_tokens cuts the answer and says `length`."""
    settings.CHAT_MAX_NEW_TOKENS = 5
    request_id = await client.prompt(LONG)
    done = (await client.receive_until("done", request_id))[-1]
    assert done["finish_reason"] == "length" and done["metrics"]["new_tokens"] == 5


async def test_a_visitor_cannot_continue_someone_elses_conversation(make_client):
    """Conversations are private to their session: another visitor gets unknown_conversation."""
    owner = await make_client(session_key=await new_session_key())
    request_id = await owner.prompt(SHORT)
    conversation = (await owner.receive_until("done", request_id))[0]["conversation"]
    stranger = await make_client(session_key=await new_session_key())
    await stranger.prompt("What did they say?", conversation=conversation, request_id="peek")
    error = await stranger.receive()
    assert (error["type"], error["code"]) == ("error", "unknown_conversation")


async def test_the_same_session_continues_its_conversation_on_a_new_connection(make_client):
    """A reconnecting page (same session cookie) can go on with its conversation."""
    key = await new_session_key()
    first = await make_client(session_key=key)
    request_id = await first.prompt(SHORT)
    conversation = (await first.receive_until("done", request_id))[0]["conversation"]
    await first.close()
    again = await make_client(session_key=key)
    request_id = await again.prompt("And to 6?", conversation=conversation)
    assert (await again.receive_until("done", request_id))[0]["conversation"] == conversation


async def test_cross_origin_websocket_is_refused(application):
    """A page on another origin cannot open the chat socket."""
    from channels.testing import WebsocketCommunicator

    communicator = WebsocketCommunicator(
        application, "/ws/chat/", headers=[(b"origin", b"http://evil.example")]
    )
    connected, _ = await communicator.connect()
    assert not connected
    await communicator.disconnect()


async def test_a_user_over_the_rate_limit_gets_a_clear_error(client, monkeypatch):
    """Past the per-user limit a prompt is refused with `rate_limited`, before anything runs."""
    from chat.infra import ratelimit

    monkeypatch.setattr(ratelimit.prompt_limiter, "limit", 1)
    first = await client.prompt(SHORT)
    await client.receive_until("done", first)
    await client.prompt(SHORT, request_id="again")
    error = await client.receive()
    assert (error["code"], error["request_id"]) == ("rate_limited", "again")
    assert "at most 1 a minute" in error["message"]


async def test_a_finished_turn_shows_up_in_the_prometheus_metrics(client, scrape_metrics):
    """/metrics counts the request by finish_reason and observes its time to first token."""

    def sample(text: str, name: str) -> float:
        for line in text.splitlines():
            if line.split(" ")[0] == name:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = await scrape_metrics()
    request_id = await client.prompt(SHORT)
    await client.receive_until("done", request_id)
    after = await scrape_metrics()
    eos = 'chat_request_success_total{finish_reason="eos"}'
    assert sample(after, eos) == sample(before, eos) + 1
    assert (
        sample(after, "chat_time_to_first_token_seconds_count")
        == sample(before, "chat_time_to_first_token_seconds_count") + 1
    )
    assert "chat_requests_waiting" in after and "chat_cache_misses_total" in after


async def test_a_model_failure_mid_answer_is_an_error_and_the_queue_goes_on(
    client, runtime, monkeypatch
):
    """The model raising after some text: the client gets `error`, the partial text is stored as failed,
    and the next prompt is answered normally."""
    from chat.engine.local.decoding import RunningBatch

    original = RunningBatch.add

    def failing(batch, rows):
        monkeypatch.setattr(RunningBatch, "add", original)  # only this call fails
        rows[0].on_text("Partial ")
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(RunningBatch, "add", failing)
    request_id = await client.prompt(SHORT)
    events = await client.receive_until("error", request_id)
    assert [e["type"] for e in events] == ["accepted", "chunk", "error"]
    assert events[-1]["code"] == "model_error" and "try again" in events[-1]["message"]
    message = await wait_stored(events[0]["message"])
    assert (message.status, message.text) == ("failed", "Partial ") and "simulated" in message.error
    again = await client.prompt(SHORT, request_id="after")
    assert (await client.receive_until("done", again))[-1]["finish_reason"] in ("eos", "length")
