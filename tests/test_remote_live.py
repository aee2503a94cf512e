"""The whole product on the remote backend: a live daphne that loads no model, streaming from a loopback server."""

from __future__ import annotations

import json

import pytest
import websockets

from harness.openai_server import FakeOpenAIServer

from .conftest import LIVE_CACHE_URL
from .test_live import receive_until_done

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fake(backend):
    server = FakeOpenAIServer(backend, api_key="live-key").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def remote_daphne(fake, tmp_path_factory):
    from harness.liveserver import LiveServer

    server = LiveServer(
        tmp_path_factory.mktemp("remote-live"),
        CHAT_CACHE_REDIS_URL=LIVE_CACHE_URL,
        CHAT_BACKEND="openai",
        CHAT_REMOTE=f"{fake.url.replace('://', '://:live-key@')}?model={fake.model}&concurrency=2",
    ).start()
    yield server
    server.stop()


async def test_a_daphne_on_the_remote_backend_streams_caches_and_cancels_upstream(
    remote_daphne, fake
):
    """Over a real socket: a streamed answer from the inference server, the same prompt again from the
    cache with no upstream request, and a Stop that closes the upstream stream and stops its model."""
    status, health = remote_daphne.health()
    assert status == 200 and health["backend"] == "openai" and health["model_name"] == fake.model
    assert health["upstream_status"] == "ok" and health["status"] == "ok"

    prompt = "Count from 1 to 10, separated by commas."
    async with websockets.connect(remote_daphne.ws_url, origin=remote_daphne.url) as ws:
        await ws.send(json.dumps({"type": "prompt", "request_id": "a", "text": prompt}))
        first = await receive_until_done(ws, "a")
        upstream_requests = len(fake.served)
        await ws.send(json.dumps({"type": "prompt", "request_id": "b", "text": prompt}))
        again = await receive_until_done(ws, "b")

        await ws.send(
            json.dumps(
                {
                    "type": "prompt",
                    "request_id": "c",
                    "text": "Write a very long story about a dragon.",
                }
            )
        )
        while json.loads(await ws.recv())["type"] != "chunk":
            pass
        stopped_upstream = fake.served[-1]
        await ws.send(json.dumps({"type": "cancel", "request_id": "c"}))
        cancelled = await receive_until_done(ws, "c")

    done = first[-1]
    assert [e["type"] for e in first][0] == "accepted" and done["type"] == "done"
    assert sum(e["type"] == "chunk" for e in first) > 3
    assert "".join(e["text"] for e in first if e["type"] == "chunk") == done["text"]
    assert (
        done["finish_reason"] in ("eos", "length")
        and done["text"].strip()
        and done["cached"] is False
    )
    assert done["metrics"]["new_tokens"] == fake.served[upstream_requests - 1].new_tokens
    assert fake.served[upstream_requests - 1].body["messages"][-1] == {
        "role": "user",
        "content": prompt,
    }

    assert (
        again[-1]["type"] == "done"
        and again[-1]["cached"] is True
        and again[-1]["text"] == done["text"]
    )

    assert cancelled[-1]["type"] == "done" and cancelled[-1]["finish_reason"] == "cancelled"
    assert fake.wait_for(stopped_upstream.done.is_set)
    assert (
        stopped_upstream.client_gone_at is not None
        and stopped_upstream.finish_reason == "cancelled"
    )
    assert len(fake.served) == upstream_requests + 1  # the cached answer never went upstream
