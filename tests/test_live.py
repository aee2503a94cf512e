"""A real daphne and a real WebSocket client over loopback."""

import asyncio
import json

import pytest
import websockets

pytestmark = pytest.mark.integration


async def receive_until_done(ws, request_id):
    events = []
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 120))
        events.append(event)
        if event["type"] in {"done", "error"} and event.get("request_id") == request_id:
            return events


async def test_a_real_websocket_client_gets_a_streamed_answer(daphne_server):
    """Over a real socket: accepted, several chunks, done; chunks assemble to the final text."""
    async with websockets.connect(daphne_server.ws_url, origin=daphne_server.url) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "prompt",
                    "request_id": "live-1",
                    "text": "Count from 1 to 10, separated by commas.",
                }
            )
        )
        events = await receive_until_done(ws, "live-1")
    kinds = [e["type"] for e in events]
    assert kinds[0] == "accepted" and kinds[-1] == "done" and kinds.count("chunk") > 3
    done = events[-1]
    assert "".join(e["text"] for e in events if e["type"] == "chunk") == done["text"]
    assert done["finish_reason"] in ("eos", "length") and done["text"].strip()


async def test_closing_a_real_socket_frees_the_model_for_the_next_user(daphne_server):
    """A tab closed mid-answer stops its generation: the next user is not queued behind it."""
    async with websockets.connect(daphne_server.ws_url, origin=daphne_server.url) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "prompt",
                    "request_id": "long",
                    "text": "Write a very long story about a dragon.",
                }
            )
        )
        while json.loads(await ws.recv())["type"] != "chunk":
            pass
    await asyncio.sleep(0.5)  # let the server notice the close and run at most one more step
    async with websockets.connect(daphne_server.ws_url, origin=daphne_server.url) as ws:
        await ws.send(json.dumps({"type": "prompt", "request_id": "next", "text": "Say hi."}))
        accepted = json.loads(await ws.recv())
        assert accepted["type"] == "accepted" and accepted["queue_position"] == 0
        events = await receive_until_done(ws, "next")
        assert events[-1]["type"] == "done"


async def test_a_foreign_origin_is_refused_by_the_daphne_server(daphne_server):
    """Cross-origin WebSockets are rejected at the handshake."""
    try:
        async with websockets.connect(daphne_server.ws_url, origin="http://evil.example"):
            raise AssertionError("a foreign origin was accepted")
    except websockets.exceptions.InvalidStatus as exc:
        assert exc.response.status_code == 403
