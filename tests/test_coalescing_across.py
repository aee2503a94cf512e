"""Two daphne processes on one Redis: identical prompts in flight share one generation across
them, on the local model and in front of an inference server."""

from __future__ import annotations

import asyncio
import json
import os
import re

import pytest

from harness.liveserver import LiveServer
from harness.openai_server import FakeOpenAIServer
from tests.conftest import LIVE_CACHE_URL
from tests.test_consumer import LONG
from tests.test_scaleout import Visitor, database_url, receive, receive_until  # noqa: F401

pytestmark = pytest.mark.integration

POLICY = "story"  # a few dozen tokens: long enough to join, short enough to wait for
# For the tests that join a running answer and then cancel or kill its owner: long enough that the
# owner is still generating then. A follower's first text can come half a second after it joins
# (the owner's writes while nobody followed), by which time a few dozen tokens may all be done.
LONG_POLICY = "long-story"


@pytest.fixture(scope="module")
def servers(database_url, tmp_path_factory):  # noqa: F811 (the imported fixture)
    """Processes A and B on one database and one Redis, with a short lease, so that a killed
    owner is noticed within seconds."""
    env = {
        "CHAT_CACHE_REDIS_URL": LIVE_CACHE_URL,
        "CHAT_ENGINE": "threads=1",
        "CHAT_TIMEOUTS": "lease=2",
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    }
    workdir = tmp_path_factory.mktemp("coalescing")
    started = LiveServer.start_together(
        [LiveServer(workdir, database_url=database_url, **env) for _ in range(2)]
    )
    try:
        started[0].policy(POLICY, max_new_tokens=48)
        started[0].policy(LONG_POLICY, max_new_tokens=256)
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def remote_servers(database_url, backend, tmp_path_factory):  # noqa: F811 (the imported fixture)
    """Two processes on CHAT_BACKEND=openai in front of one loopback inference server (serving
    the real model's tokens from this process)."""
    fake = FakeOpenAIServer(backend).start()
    env = {
        "CHAT_CACHE_REDIS_URL": LIVE_CACHE_URL,
        "CHAT_BACKEND": "openai",
        "CHAT_REMOTE": f"{fake.url}?model={fake.model}",
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    }
    workdir = tmp_path_factory.mktemp("coalescing-remote")
    started: list[LiveServer] = []
    try:
        started = LiveServer.start_together(
            [LiveServer(workdir, database_url=database_url, **env) for _ in range(2)]
        )
        started[0].policy(POLICY, max_new_tokens=48)
        yield fake, started
    finally:
        for server in started:
            server.stop()
        fake.stop()


def counters(server: LiveServer) -> dict[str, float]:
    """The server's /metrics counters this test reads, by name (labels kept)."""
    text = server.metrics()
    wanted = ("chat_prefill_tokens_total", "chat_coalesced")
    return {
        name: float(value)
        for name, value in re.findall(r"^(\S+) (\S+)$", text, re.MULTILINE)
        if name.startswith(wanted)
    }


def prefilled(before: dict[str, float], after: dict[str, float]) -> float:
    """Prompt tokens the model took in (computed or reused from the prefix store) in between."""
    return sum(
        after[name] - before.get(name, 0.0)
        for name in after
        if name.startswith("chat_prefill_tokens_total")
    )


def prompt(request_id: str, policy: str = POLICY) -> str:
    return json.dumps({"type": "prompt", "request_id": request_id, "text": LONG, "policy": policy})


async def joined(owner_ws, follower_ws, policy: str = LONG_POLICY) -> tuple[dict, dict]:
    """The prompt sent to the owner and generating, then to the follower and replayed; their `accepted`."""
    await owner_ws.send(prompt("a", policy))
    accepted_a = await receive(owner_ws)
    await receive_until(owner_ws, "chunk")
    await follower_ws.send(prompt("b", policy))
    accepted_b = await receive(follower_ws)
    await receive_until(follower_ws, "chunk")
    assert accepted_a["type"] == accepted_b["type"] == "accepted"
    return accepted_a, accepted_b


def chunks(events: list[dict]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "chunk")


async def test_the_same_prompt_sent_to_both_processes_at_once_is_generated_once(servers):
    """Two complete identical answers, each stored as its own message; the model prefilled the
    prompt once, and one of the two followed the other's generation."""
    a, b = servers
    visitor = Visitor(a)
    before = [counters(server) for server in servers]
    async with visitor.socket(a) as on_a, visitor.socket(b) as on_b:
        await asyncio.gather(on_a.send(prompt("a")), on_b.send(prompt("b")))
        got = await asyncio.gather(receive_until(on_a, "done"), receive_until(on_b, "done"))
    after = [counters(server) for server in servers]
    ends = [events[-1] for events in got]
    assert [end["cached"] for end in ends] == [False, False]
    assert ends[0]["text"] == ends[1]["text"] and ends[0]["finish_reason"] in ("eos", "length")
    assert ends[0]["message"] != ends[1]["message"]
    for events, end, server in zip(got, ends, servers, strict=True):
        assert chunks(events) == end["text"]
        accepted = events[0]
        stored = visitor.answer(server, accepted["conversation"], accepted["message"])
        assert (stored["status"], stored["text"]) == ("done", end["text"])
    followed = sum(
        after[i]["chat_coalesced_remote_requests_total"]
        - before[i].get("chat_coalesced_remote_requests_total", 0.0)
        for i in range(2)
    )
    assert followed == 1
    prompt_tokens = ends[0]["metrics"]["prompt_tokens"]
    assert prefilled(before[0], after[0]) + prefilled(before[1], after[1]) == prompt_tokens


async def test_a_followers_cancel_leaves_the_owners_answer_complete(servers):
    a, b = servers
    visitor = Visitor(a)
    async with visitor.socket(a) as on_a, visitor.socket(b) as on_b:
        accepted_a, accepted_b = await joined(on_a, on_b)
        await on_b.send(json.dumps({"type": "cancel", "request_id": "b"}))
        cancelled = (await receive_until(on_b, "done"))[-1]
        finished = (await receive_until(on_a, "done"))[-1]
    assert cancelled["finish_reason"] == "cancelled"
    assert finished["finish_reason"] in ("eos", "length")
    assert finished["text"].startswith(cancelled["text"])
    owner = visitor.answer(a, accepted_a["conversation"], accepted_a["message"])
    follower = visitor.answer(b, accepted_b["conversation"], accepted_b["message"])
    assert (owner["status"], owner["text"]) == ("done", finished["text"])
    assert follower["status"] == "cancelled"


async def test_the_owners_cancel_leaves_the_followers_answer_complete(servers):
    a, b = servers
    visitor = Visitor(a)
    async with visitor.socket(a) as on_a, visitor.socket(b) as on_b:
        accepted_a, accepted_b = await joined(on_a, on_b)
        await on_a.send(json.dumps({"type": "cancel", "request_id": "a"}))
        cancelled = (await receive_until(on_a, "done"))[-1]
        finished = (await receive_until(on_b, "done"))[-1]
    assert cancelled["finish_reason"] == "cancelled"
    assert finished["finish_reason"] in ("eos", "length")
    assert finished["text"].startswith(cancelled["text"])
    follower = visitor.answer(b, accepted_b["conversation"], accepted_b["message"])
    assert (follower["status"], follower["text"]) == ("done", finished["text"])


async def test_a_follower_of_a_killed_owner_gets_an_error_not_a_hang(servers):
    """Runs after the other tests on `servers`: it kills process A. B's turn ends with an error frame once A's lease runs out,
    and its message is stored as failed."""
    a, b = servers
    visitor = Visitor(b)
    async with visitor.socket(a) as on_a, visitor.socket(b) as on_b:
        _, accepted_b = await joined(on_a, on_b)
        assert a.process is not None
        a.process.kill()  # SIGKILL: no drain, no last event
        events = [await receive(on_b)]
        while events[-1]["type"] not in ("error", "done"):  # a done would fail, not hang
            events.append(await receive(on_b))
    assert events[-1]["type"] == "error", events[-1]
    assert events[-1]["code"] == "model_error"
    stored = visitor.answer(b, accepted_b["conversation"], accepted_b["message"])
    assert stored["status"] == "failed"


async def test_on_the_remote_tier_the_same_prompt_on_both_processes_opens_one_upstream_stream(
    remote_servers,
):
    """Coalescing sits above the scheduler: two web processes in front of one inference server
    send it one request, and both answer in full."""
    fake, (a, b) = remote_servers
    visitor = Visitor(a)
    posts = fake.posts
    async with visitor.socket(a) as on_a, visitor.socket(b) as on_b:
        await asyncio.gather(on_a.send(prompt("a")), on_b.send(prompt("b")))
        got = await asyncio.gather(receive_until(on_a, "done"), receive_until(on_b, "done"))
    ends = [events[-1] for events in got]
    assert fake.posts - posts == 1
    assert [end["cached"] for end in ends] == [False, False]
    assert ends[0]["text"] == ends[1]["text"] and ends[0]["finish_reason"] in ("eos", "length")
    assert [chunks(events) for events in got] == [ends[0]["text"]] * 2
