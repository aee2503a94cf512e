"""Two daphne processes sharing one PostgreSQL and one Redis: the cache and a cancel cross processes."""

import asyncio
import http.client
import json
import os
import time
import urllib.error
import urllib.request
from http.cookies import SimpleCookie

import pytest
import websockets

from harness.liveserver import LiveServer, fresh_database_like
from tests.conftest import LIVE_CACHE_URL
from tests.test_consumer import LONG, SHORT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def database_url():
    """A fresh PostgreSQL database for the two servers, dropped at the end of the session."""
    return fresh_database_like("postgres://postgres@127.0.0.1:5432/chat")


@pytest.fixture(scope="module")
def servers(database_url, tmp_path_factory):
    """Processes A and B: one database, one Redis for the channel layer, one for the cache."""
    env = {
        "CHAT_CACHE_REDIS_URL": LIVE_CACHE_URL,
        "CHAT_ENGINE": "threads=1",
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        # A dropped client stops its answer at once: within the default 10 s of grace the model
        # finishes a long answer here, and these tests are about cancels, not resuming.
        "CHAT_TIMEOUTS": "resume=0",
    }
    workdir = tmp_path_factory.mktemp("scaleout")
    started = LiveServer.start_together(
        [LiveServer(workdir, database_url=database_url, **env) for _ in range(2)]
    )
    try:
        yield started
    finally:
        for server in started:
            server.stop()


class Visitor:
    """A browser's cookies (session + CSRF), used against either server."""

    def __init__(self, server: LiveServer):
        with urllib.request.urlopen(server.url + "/") as page:
            cookies = SimpleCookie()
            for header in page.headers.get_all("Set-Cookie"):
                cookies.load(header)
        self.session = cookies["sessionid"].value
        self.csrf = cookies["csrftoken"].value
        self.cookie = f"sessionid={self.session}; csrftoken={self.csrf}"

    def socket(self, server: LiveServer):
        return websockets.connect(
            server.ws_url, origin=server.url, additional_headers={"Cookie": self.cookie}
        )

    def post(self, server: LiveServer, path: str, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(
            server.url + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Cookie": self.cookie,
                "X-CSRFToken": self.csrf,
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    def get(self, server: LiveServer, path: str) -> dict:
        request = urllib.request.Request(server.url + path, headers={"Cookie": self.cookie})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)

    def answer(self, server: LiveServer, conversation: int, message: int) -> dict:
        detail = self.get(server, f"/api/conversations/{conversation}/")
        return next(m for m in detail["messages"] if m["id"] == message)


async def receive(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), 120))


async def receive_until(ws, kind: str) -> list[dict]:
    events = []
    while True:
        events.append(await receive(ws))
        if events[-1]["type"] == kind:
            return events


async def first_chunk(ws, text: str) -> dict:
    """Send a prompt and wait until it is generating; returns its `accepted` event."""
    await ws.send(json.dumps({"type": "prompt", "request_id": "r", "text": text}))
    accepted = await receive(ws)
    assert accepted["type"] == "accepted", accepted
    await receive_until(ws, "chunk")
    return accepted


async def test_an_answer_cached_by_one_process_is_served_by_the_other(servers):
    """A generates and caches; the same prompt on B is one `done` with cached=true and the same text."""
    a, b = servers
    visitor = Visitor(a)
    async with visitor.socket(a) as ws:
        await ws.send(json.dumps({"type": "prompt", "request_id": "a", "text": SHORT}))
        first = await receive_until(ws, "done")
    assert first[-1]["cached"] is False and any(e["type"] == "chunk" for e in first)
    async with visitor.socket(b) as ws:
        await ws.send(json.dumps({"type": "prompt", "request_id": "b", "text": SHORT}))
        second = await receive_until(ws, "done")
    assert [e["type"] for e in second] == ["accepted", "done"]
    assert second[-1]["cached"] is True and second[-1]["text"] == first[-1]["text"]


async def test_a_cancel_frame_sent_to_the_other_process_stops_the_turn(servers):
    """A turn generating on A is stopped by a cancel frame (with `message`) on B's socket: done is `cancelled`."""
    a, b = servers
    visitor = Visitor(a)
    async with visitor.socket(a) as on_a, visitor.socket(b) as on_b:
        accepted = await first_chunk(on_a, LONG)
        await on_b.send(json.dumps({"type": "cancel", "message": accepted["message"]}))
        ack = await receive(on_b)
        assert (ack["type"], ack["result"]) == ("cancel_ack", "sent")
        done = (await receive_until(on_a, "done"))[-1]
    assert done["finish_reason"] == "cancelled"
    stored = visitor.answer(b, accepted["conversation"], accepted["message"])
    assert (stored["status"], stored["finish_reason"]) == ("cancelled", "cancelled")


async def test_post_api_chat_cancel_on_the_other_process_stops_the_turn(servers):
    """The HTTP cancel on B reaches the turn on A as well."""
    a, b = servers
    visitor = Visitor(b)
    async with visitor.socket(a) as on_a:
        accepted = await first_chunk(on_a, LONG)
        status, ack = await asyncio.to_thread(
            visitor.post, b, "/api/chat/cancel", {"message": accepted["message"]}
        )
        assert status == 200 and ack["result"] == "sent"
        done = (await receive_until(on_a, "done"))[-1]
    assert done["finish_reason"] == "cancelled"
    assert visitor.answer(a, accepted["conversation"], accepted["message"])["status"] == "cancelled"


async def test_another_visitors_cancel_on_the_other_process_does_not_stop_the_turn(servers):
    """A stranger naming the answer on B gets `unknown_request` (socket) and 404 (HTTP); the answer ends normally."""
    a, b = servers
    owner, stranger = Visitor(a), Visitor(b)
    async with owner.socket(a) as on_a, stranger.socket(b) as on_b:
        accepted = await first_chunk(on_a, SHORT)
        await on_b.send(
            json.dumps({"type": "cancel", "request_id": "x", "message": accepted["message"]})
        )
        error = await receive(on_b)
        assert (error["type"], error["code"]) == ("error", "unknown_request")
        status, refused = await asyncio.to_thread(
            stranger.post, b, "/api/chat/cancel", {"message": accepted["message"]}
        )
        assert status == 404 and refused["code"] == "unknown_request"
        done = (await receive_until(on_a, "done"))[-1]
    assert done["finish_reason"] in ("eos", "length")  # not cancelled by the stranger


def test_closing_an_sse_stream_under_daphne_cancels_the_turn(servers):
    """Over a real socket: a client that drops POST /api/chat/stream mid-answer leaves it stored `cancelled`."""
    a, b = servers
    visitor = Visitor(a)
    connection = http.client.HTTPConnection("127.0.0.1", a.port, timeout=60)
    connection.request(
        "POST",
        "/api/chat/stream",
        body=json.dumps({"text": LONG}),
        headers={
            "Content-Type": "application/json",
            "Cookie": visitor.cookie,
            "X-CSRFToken": visitor.csrf,
        },
    )
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Content-Type").startswith(
        "text/event-stream"
    )
    events = []
    while not any(e["type"] == "chunk" for e in events):
        line = response.readline().decode()
        if line.startswith("data: "):
            events.append(json.loads(line[len("data: ") :]))
    connection.close()
    accepted = events[0]
    for _ in range(600):
        stored = visitor.answer(b, accepted["conversation"], accepted["message"])
        if stored["status"] != "streaming":
            break
        time.sleep(0.1)
    assert (stored["status"], stored["finish_reason"]) == ("cancelled", "cancelled")
