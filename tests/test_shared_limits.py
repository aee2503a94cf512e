"""The prompt rate limit is one limit for every server process: counted in Redis, atomically,
and counted per process (and said so in /healthz) while Redis is away."""

import asyncio
import json
import urllib.error
import urllib.request

import pytest
import websockets

from chat.infra.ratelimit import SharedRateLimiter
from harness.liveserver import LiveServer, free_port

pytestmark = pytest.mark.integration


def test_two_processes_limiters_share_one_window(settings):
    """Two limiters, as two processes hold them, on the same Redis: 3 prompts in all, not 3 each."""
    first, second = SharedRateLimiter("t-shared", 3), SharedRateLimiter("t-shared", 3)
    first.clear()
    assert [first.check("user:1"), second.check("user:1"), first.check("user:1")] == [0, 0, 0]
    assert second.wait("user:1") > 0 and first.check("user:1") > 0
    assert 55 < second.check("user:1") <= 60  # until the oldest of the three leaves the window
    assert first.check("user:2") == 0  # keys stay apart
    assert first.status() == "ok"
    first.clear()


def test_without_redis_each_process_counts_its_own_and_says_so(settings):
    """Redis unreachable: the limit still holds, per process, and status says so; it comes back."""
    limiter = SharedRateLimiter("t-fallback", 2)
    limiter._guard.backoff_seconds = 0.0
    reachable = settings.REDIS_URL
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    assert [limiter.check("k"), limiter.check("k")] == [0, 0]
    assert limiter.check("k") > 0  # the local window refuses the third
    assert "counted per process" in limiter.status()
    settings.REDIS_URL = reachable
    limiter.clear()
    assert limiter.check("k") == 0 and limiter.status() == "ok"
    limiter.clear()


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    """Two daphne processes without a model, a limit of 3 prompts a minute per address."""
    servers = []
    try:
        for name in ("a", "b"):
            servers.append(
                LiveServer(
                    tmp_path_factory.mktemp(f"limits-{name}"),
                    CHAT_BACKEND="none",
                    CHAT_RATE_LIMITS="prompt=100/1m,prompt_address=3/1m",
                ).start(wait_for_model=False)
            )
        yield servers
    finally:
        for server in servers:
            server.stop()


async def prompt_once(server) -> dict:
    """A cookieless visitor's one prompt: past the limit `rate_limited`, else `model_loading`."""
    async with websockets.connect(server.ws_url, origin=server.url) as ws:
        await ws.send(json.dumps({"type": "prompt", "request_id": "p", "text": "hi"}))
        return json.loads(await asyncio.wait_for(ws.recv(), 10))


async def test_two_daphne_processes_enforce_one_limit(two_servers):
    """Prompts from one address spread over two processes: the fourth is refused, wherever it lands."""
    a, b = two_servers
    codes = [(await prompt_once(server))["code"] for server in (a, b, a, b, a)]
    assert codes == ["model_loading"] * 3 + ["rate_limited"] * 2
    try:  # 503 without a model; the report says how the limit is counted all the same
        urllib.request.urlopen(b.url + "/healthz")  # noqa: ASYNC210 (the servers are other processes)
    except urllib.error.HTTPError as not_ready:
        assert json.loads(not_ready.read())["rate_limit"] == "ok"
    else:
        raise AssertionError("a server without a model reported ready")
