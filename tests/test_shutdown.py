"""SIGTERM to a real daphne (project/shutdown.py): it drains, stores every answer, closes the
sockets with 4012 and exits; new prompts meanwhile are refused with `server_restarting`."""

import asyncio
import json
import time
import urllib.error
import urllib.request

import openai
import pytest
import websockets
from django.test import AsyncClient
from websockets.exceptions import ConnectionClosed

from chat import turns
from chat.infra.runtime import runtime as chat_runtime
from chat.protocol import CLOSE_SERVER_RESTARTING
from harness.liveserver import LiveServer
from tests.conftest import LIVE_CACHE_URL
from tests.test_consumer import LONG, SHORT, wait_stored
from tests.test_openai_api import MAKE_KEYS

ws_db = pytest.mark.django_db(transaction=True)


def start_server(tmp_path, drain_seconds: float) -> LiveServer:
    return LiveServer(
        tmp_path,
        CHAT_CACHE_REDIS_URL=LIVE_CACHE_URL,
        CHAT_TIMEOUTS=f"drain={drain_seconds}",
    ).start()


@pytest.fixture
def short_drain(tmp_path):
    """A daphne of this test's own (SIGTERM ends it) whose answers get 2 s to finish."""
    server = start_server(tmp_path, 2)
    yield server
    server.stop()


@pytest.fixture
def long_drain(tmp_path):
    server = start_server(tmp_path, 30)
    yield server
    server.stop()


def health(server: LiveServer) -> tuple[int, dict | None]:
    """/healthz's status and body, also for a 503 (LiveServer.health drops that body)."""
    try:
        with urllib.request.urlopen(server.url + "/healthz", timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)
    except OSError:
        return 0, None


def stored_status(server: LiveServer, message_id: int) -> str:
    return server.query("SELECT status FROM chat_message WHERE id = ?", (message_id,))[0]["status"]


async def receive(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), 120))


async def start_answer(ws, request_id: str, text: str) -> dict:
    """Send a prompt and wait until it is generating; its `accepted`."""
    await ws.send(json.dumps({"type": "prompt", "request_id": request_id, "text": text}))
    accepted = await receive(ws)
    assert accepted["type"] == "accepted", accepted
    while (await receive(ws))["type"] != "chunk":
        pass
    return accepted


async def until_done(ws) -> dict:
    while (event := await receive(ws))["type"] != "done":
        assert event["type"] in {"chunk", "queued", "buffering"}, event
    return event


async def close_code(ws) -> int:
    """The code the server closed the socket with (after any events still on the way)."""
    with pytest.raises(ConnectionClosed) as closed:  # noqa: PT012 (read until the close)
        while True:
            await asyncio.wait_for(ws.recv(), 60)
    return closed.value.rcvd.code


def wait_exit(server: LiveServer) -> int:
    server.process.wait(60)
    return server.process.returncode


@pytest.mark.integration
async def test_sigterm_mid_answer_cancels_it_after_the_drain_stores_it_and_closes_with_4012(
    short_drain,
):
    """A long answer on a socket and a streamed /v1/chat/completions are running; SIGTERM:
    /healthz says 503 draining, a new prompt gets `server_restarting`, both answers end
    `cancelled` (reason server_restarting) once the drain is over, are stored, the stream ends
    with its finish chunk and [DONE], the sockets close with 4012, and the process exits 0."""
    server = short_drain
    key = json.loads(server.manage("shell", "-c", MAKE_KEYS).strip().splitlines()[-1])["alice"]
    api = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)
    async with (
        websockets.connect(server.ws_url, origin=server.url) as running,
        websockets.connect(server.ws_url, origin=server.url) as newcomer,
    ):
        accepted = await start_answer(running, "long", LONG)
        stream = await api.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": LONG}], stream=True
        )
        chunks = aiter(stream)
        first = await anext(chunks)  # the role chunk: the turn was accepted
        server.process.terminate()
        deadline = time.monotonic() + 10
        while (status := health(server))[0] != 503 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert status[0] == 503 and status[1]["status"] == "draining"

        await newcomer.send(json.dumps({"type": "prompt", "request_id": "new", "text": SHORT}))
        refused = await receive(newcomer)
        assert refused["type"] == "error" and refused["code"] == "server_restarting"
        assert refused["request_id"] == "new"

        done = await until_done(running)
        assert done["finish_reason"] == "cancelled" and done["reason"] == "server_restarting"
        rest = [chunk async for chunk in chunks]  # ends cleanly: no dropped connection
        assert first.id == rest[-1].id and rest[-1].choices[0].finish_reason == "stop"
        assert await close_code(running) == CLOSE_SERVER_RESTARTING
        assert await close_code(newcomer) == CLOSE_SERVER_RESTARTING
    assert wait_exit(server) == 0
    assert stored_status(server, accepted["message"]) == "cancelled"
    statuses = [row["status"] for row in server.query("SELECT status FROM chat_message")]
    assert "streaming" not in statuses
    assert "0 answer(s) finished, 2 cancelled" in server.log()


@pytest.mark.integration
async def test_an_answer_that_ends_within_the_drain_finishes_and_is_stored(long_drain):
    """With time enough, SIGTERM lets the running answer end by itself; then the socket closes."""
    server = long_drain
    async with websockets.connect(server.ws_url, origin=server.url) as ws:
        accepted = await start_answer(ws, "short", SHORT)
        server.process.terminate()
        done = await until_done(ws)
        assert done["finish_reason"] != "cancelled"
        assert await close_code(ws) == CLOSE_SERVER_RESTARTING
    assert wait_exit(server) == 0
    assert stored_status(server, accepted["message"]) == "done"


@pytest.mark.integration
def test_idle_sigterm_exits_cleanly(tmp_path):
    """Nothing running: SIGTERM ends the process with status 0 (how long it takes is measured
    in docs/operations.md, not asserted here)."""
    server = start_server(tmp_path, 10)
    server.process.terminate()
    assert wait_exit(server) == 0
    assert "drained in" in server.log()


# -- the same steps in process (channels' communicator), without a process to stop -------


@pytest.fixture
def draining(runtime, monkeypatch):
    monkeypatch.setattr(chat_runtime, "draining", True)


@pytest.mark.integration
@ws_db
async def test_while_draining_prompts_get_server_restarting_everywhere(client, draining):
    """Socket: `error` server_restarting, the socket stays open; HTTP: 503 with Retry-After;
    /healthz: 503 "draining"."""
    request_id = await client.prompt(SHORT)
    refused = await client.receive()
    assert refused["type"] == "error" and refused["code"] == "server_restarting"
    assert refused["request_id"] == request_id
    await client.send({"type": "ping"})
    assert (await client.receive())["type"] == "pong"

    http = AsyncClient(enforce_csrf_checks=False)
    response = await http.post("/api/chat/stream", {"text": SHORT}, content_type="application/json")
    assert response.status_code == 503 and response.json()["code"] == "server_restarting"
    assert response["Retry-After"] == "5"
    health = await http.get("/healthz")
    assert health.status_code == 503 and health.json()["status"] == "draining"


@pytest.mark.integration
@ws_db
async def test_turns_drain_cancels_what_runs_past_the_drain_and_stores_it(client, monkeypatch):
    """An answer still running when the drain ends is cancelled with reason server_restarting,
    its `done` still reaches the client, and it is stored `cancelled`."""
    request_id = await client.prompt(LONG)
    accepted = (await client.receive_until("chunk", request_id))[0]
    monkeypatch.setattr(chat_runtime, "draining", True)
    assert await turns.turns_drain(0.2) == (0, 1)
    done = (await client.receive_until("done", request_id))[-1]
    assert done["finish_reason"] == "cancelled" and done["reason"] == "server_restarting"
    message = await wait_stored(accepted["message"])
    assert message.status == "cancelled" and message.text == done["text"]
