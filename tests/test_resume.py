"""Resuming an answer: numbered events, the grace period, the text saved as it grows, an
interrupted answer continued, and SSE's Last-Event-ID against a live daphne."""

import asyncio
import http.client
import http.cookiejar
import json
import time
import urllib.request

import pytest
from asgiref.sync import sync_to_async

from chat.infra import metrics as prometheus
from chat.models import Message
from chat.protocol import NO_LISTENER
from chat.stores.recovery import interrupted_answers_close
from tests.conftest import chunks_text
from tests.test_consumer import LONG, SHORT, new_session_key, stored, wait_stored

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def orphaned_total() -> float:
    """Answers stopped for want of a listener, every policy's together (/metrics)."""
    return sum(
        sample.value
        for metric in prometheus.ANSWERS_ORPHANED.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def seqs(events: list[dict]) -> list[int]:
    return [e["seq"] for e in events if "seq" in e]


async def chunks(client, request_id: str, n: int) -> list[dict]:
    """Events up to the n-th chunk of `request_id`."""
    events: list[dict] = []
    while sum(e["type"] == "chunk" for e in events) < n:
        events.append(await client.receive())
    return events


async def test_a_resumed_answer_gets_every_event_it_missed_once_then_the_live_ones(
    make_client, make_policy, settings
):
    """A socket closes after a few chunks; a new socket of the same visitor resumes from the
    last number it saw: the numbers run on from 1 without a gap or a repeat, and the chunks of
    both sockets make exactly the final text."""
    settings.CHAT_RESUME_GRACE_S = 30
    # Long enough to outlast the pause below on a fast CPU: an answer that ended meanwhile is
    # resumed with its final event alone (the next test), not with the events it missed.
    await sync_to_async(make_policy)(slug="resume48", mode="stream", max_new_tokens=160)
    key = await new_session_key()
    first = await make_client(session_key=key)
    request_id = await first.prompt(LONG, policy="resume48")
    before = await chunks(first, request_id, 4)
    await first.close()
    await asyncio.sleep(0.3)  # a few more events go by with nobody listening
    again = await make_client(session_key=key)
    await again.send(
        {"type": "resume", "message": before[0]["message"], "after": before[-1]["seq"]}
    )
    after = await again.receive_until("done", request_id)
    numbers = seqs(before) + seqs(after)
    assert numbers == list(range(1, len(numbers) + 1))
    done = after[-1]
    assert done["finish_reason"] in ("eos", "length")
    assert chunks_text(before) + chunks_text(after) == done["text"]
    assert before[0]["type"] == "accepted" and before[0]["seq"] == 1


async def test_an_ended_answer_resumed_gets_only_its_done_and_another_visitor_nothing(
    make_client, make_policy
):
    """Resuming an answer that has ended gives its `done` alone, numbered like its last event;
    another visitor asking for it gets `unknown_request`, as for a cancel."""
    await sync_to_async(make_policy)(slug="resume8", mode="stream", max_new_tokens=8)
    key = await new_session_key()
    owner = await make_client(session_key=key)
    request_id = await owner.prompt(SHORT, policy="resume8")
    events = await owner.receive_until("done", request_id)
    message = events[0]["message"]
    await owner.send({"type": "resume", "message": message, "after": 0})
    done = await owner.receive()
    assert done["type"] == "done" and done["text"] == events[-1]["text"]
    assert done["seq"] == events[-1]["seq"]
    stranger = await make_client()
    await stranger.send({"type": "resume", "message": message, "after": 0})
    error = await stranger.receive()
    assert error["type"] == "error" and error["code"] == "unknown_request"
    assert "text" not in error and error["request_id"] is None  # nothing of it is told


async def test_resume_frames_are_limited_per_socket_and_per_owner(
    make_client, settings, monkeypatch
):
    """Each resume reads the database and Redis: past a socket's limit, then past its owner's
    over every socket, a resume is refused with `rate_limited` before anything is read."""
    from chat.infra import ratelimit

    settings.CHAT_RATE_LIMITS = {**settings.CHAT_RATE_LIMITS, "resume_socket": (3, 60.0)}
    monkeypatch.setattr(ratelimit.resume_limiter, "limit", 5)
    key = await new_session_key()

    async def codes(chat, n: int) -> list[str]:
        for _ in range(n):
            await chat.send({"type": "resume", "message": 999_999_999, "after": 0})
        return [(await chat.receive())["code"] for _ in range(n)]

    first = await make_client(session_key=key)
    assert await codes(first, 4) == ["unknown_request"] * 3 + ["rate_limited"]
    second = await make_client(session_key=key)  # the owner's two more, over every socket
    assert await codes(second, 3) == ["unknown_request"] * 2 + ["rate_limited"]
    stranger = await make_client()  # another owner's count is their own
    assert await codes(stranger, 1) == ["unknown_request"]


async def test_an_answer_nobody_comes_back_to_stops_after_the_grace_period(make_client, settings):
    """A closed socket no longer stops the answer at once: it runs on for the grace period, then
    stops (cancelled, reason no_listener) and is counted in /metrics."""
    settings.CHAT_RESUME_GRACE_S = 1.5
    orphaned = orphaned_total()
    client = await make_client()
    request_id = await client.prompt(LONG)
    events = await chunks(client, request_id, 1)
    message_id = events[0]["message"]
    await client.close()
    closed = time.monotonic()
    await asyncio.sleep(1.0)
    assert (await stored(message_id)).status == Message.Status.STREAMING  # still going
    message = await wait_stored(message_id)
    stopped = time.monotonic() - closed
    assert message.status == Message.Status.CANCELLED and message.outcome_reason == NO_LISTENER
    assert 1.5 <= stopped < 1.5 + 2.0, stopped  # the grace, one decode step and the store
    assert orphaned_total() == orphaned + 1


async def test_a_running_answers_text_is_saved_as_it_grows(client):
    """While an answer streams, its message holds the text shown so far, at most about a second
    behind: what a crash must not take away."""
    request_id = await client.prompt(LONG)
    events = await chunks(client, request_id, 1)
    message_id = events[0]["message"]
    started = time.monotonic()
    while time.monotonic() - started < 2.5:
        events.append(await client.receive())
    shown = chunks_text(events)
    message = await stored(message_id)
    assert message.status == Message.Status.STREAMING
    assert message.text and shown.startswith(message.text)
    await client.send({"type": "cancel", "request_id": request_id})
    await client.receive_until("done", request_id)


async def test_an_interrupted_answer_keeps_its_text_and_continue_finishes_it(
    make_client, make_policy
):
    """An answer a stopped server left streaming is marked interrupted at the next start with
    its text; a resume says so (finish_reason interrupted), and Continue writes the rest."""
    await sync_to_async(make_policy)(slug="resume6", mode="stream", max_new_tokens=6)
    key = await new_session_key()
    client = await make_client(session_key=key)
    request_id = await client.prompt(LONG, policy="resume6")
    done = (await client.receive_until("done", request_id))[-1]
    message_id = done["message"]
    # As a killed server leaves it: streaming, with the text saved so far.
    await sync_to_async(Message.objects.filter(pk=message_id).update)(
        status=Message.Status.STREAMING, finish_reason=""
    )
    assert await sync_to_async(interrupted_answers_close)() == 1
    message = await stored(message_id)
    assert (message.status, message.text) == (Message.Status.INTERRUPTED, done["text"])
    await client.send({"type": "resume", "message": message_id, "after": 0})
    resumed = await client.receive()
    assert (resumed["type"], resumed["finish_reason"]) == ("done", "interrupted")
    assert resumed["text"] == done["text"]
    await client.send({"type": "continue", "request_id": "more", "message": message_id})
    events = await client.receive_until("done", "more")
    assert events[0]["text_before"] == done["text"]
    final = events[-1]
    assert final["finish_reason"] in ("eos", "length")
    assert final["text"] == done["text"] + chunks_text(events)
    assert len(final["text"]) > len(done["text"])


async def test_an_answer_generated_in_another_process_is_followed_through_redis(
    make_client, make_policy, settings
):
    """A resume that reaches a process where the answer does not run follows it through its
    stream in Redis, and counts as a listener there: the process generating it, whose own
    client left, does not stop it after the grace period; the follower gets every event once."""
    from chat.turns import running_turns

    settings.CHAT_RESUME_GRACE_S = 0.5
    await sync_to_async(make_policy)(slug="follow96", mode="stream", max_new_tokens=96)
    key = await new_session_key()
    first = await make_client(session_key=key)
    request_id = await first.prompt(LONG, policy="follow96")
    before = await chunks(first, request_id, 3)
    message_id = before[0]["message"]
    turn = running_turns.get(message_id)
    running_turns.remove(message_id)  # as seen from another process: it does not run here
    follower = await make_client(session_key=key)
    await follower.send({"type": "resume", "message": message_id, "after": before[-1]["seq"]})
    await asyncio.sleep(0.5)  # the follower is listening before the owner's client goes
    await first.close()
    after = await follower.receive_until("done", request_id)
    numbers = seqs(before) + seqs(after)
    assert numbers[: len(seqs(before))] == list(range(1, len(seqs(before)) + 1))
    assert seqs(after) == list(range(seqs(before)[-1] + 1, seqs(before)[-1] + 1 + len(after)))
    done = after[-1]
    assert done["finish_reason"] in ("eos", "length"), done  # not stopped for want of a listener
    assert chunks_text(before) + chunks_text(after) == done["text"]
    assert turn is not None and turn.finished


def _visitor(server):
    """An HTTP visitor of a live server: its cookies and CSRF token."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    token = json.load(opener.open(server.url + "/api/csrf"))["csrf_token"]
    cookie = "; ".join(f"{c.name}={c.value}" for c in jar)
    return {"Cookie": cookie, "X-CSRFToken": token, "Content-Type": "application/json"}


def _sse(response, until) -> list[tuple[str | None, dict]]:
    """(id, event) pairs read from an SSE response until `until(event)`."""
    read, event_id, data = [], None, None
    while True:
        line = response.readline().decode().rstrip("\n")
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
        elif not line and data is not None:
            read.append((event_id, data))
            if until(data):
                return read
            event_id = data = None


def test_sse_last_event_id_resumes_the_answer_from_the_event_it_names(daphne_server):
    """Over a live daphne: every numbered SSE event carries `id: <message>:<seq>`; a client that
    drops the stream and posts again with the last id as Last-Event-ID gets the events after
    it, then the live ones, and the text adds up to the final answer."""
    daphne_server.policy("sse48", mode="stream", max_new_tokens=48)
    headers = _visitor(daphne_server)
    body = json.dumps({"text": LONG, "policy": "sse48"})
    host = daphne_server.url.removeprefix("http://")
    first = http.client.HTTPConnection(host, timeout=120)
    first.request("POST", "/api/chat/stream", body, headers)
    before = _sse(first.getresponse(), lambda e: e.get("seq", 0) >= 5)
    first.close()
    assert [i for i, _ in before] == [f"{before[0][1]['message']}:{n}" for n in range(1, 6)]
    again = http.client.HTTPConnection(host, timeout=120)
    again.request("POST", "/api/chat/stream", "", {**headers, "Last-Event-ID": before[-1][0]})
    after = _sse(again.getresponse(), lambda e: e["type"] in ("done", "error"))
    again.close()
    events = [e for _, e in before + after]
    assert seqs(events) == list(range(1, len(events) + 1))
    assert after[0][1]["seq"] == 6
    assert chunks_text(events) == events[-1]["text"]
    assert events[-1]["finish_reason"] in ("eos", "length")
