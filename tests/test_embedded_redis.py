"""The embedded Redis of a checkout (project/embedded_redis.py): shared by every `project.serve`
in it, stopped only by the last, brought back when it dies; /healthz says how it is."""

import json
import os
import signal
import time
import uuid

import psutil
import pytest
import websockets

from harness.liveserver import ROOT, LiveServer
from project.embedded_redis import EmbeddedRedis
from tests.test_live import receive_until_done

pytestmark = pytest.mark.integration

SHORT = "Count from 1 to 5, separated by commas."


def redis_pid(embedded: EmbeddedRedis) -> int:
    return int((embedded.home / "redis.pid").read_text())


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(condition, what: str, timeout: float = 60):
    """Poll `condition` until it holds; a failure after `timeout`, never a measured time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def healthy(server: LiveServer) -> bool:
    status, report = server.health()
    return (
        status == 200
        and report["status"] == "ok"
        and report["redis"] == "ok"
        and report["cache"] == "ok"
        and report["rate_limit"] == "ok"
    )


async def ask(server: LiveServer, text: str = SHORT) -> dict:
    """One chat turn over a real socket; its `done`."""
    request_id = f"r-{uuid.uuid4().hex[:8]}"
    async with websockets.connect(server.ws_url, origin=server.url) as ws:
        await ws.send(json.dumps({"type": "prompt", "request_id": request_id, "text": text}))
        events = await receive_until_done(ws, request_id)
    assert events[-1]["type"] == "done", events[-1]
    return events[-1]


@pytest.fixture
def checkout(tmp_path):
    """A data directory of its own (so its embedded Redis is this test's), the converted model."""
    data = tmp_path / "data"
    env = {
        "DATA_DIR": str(data),
        "CHAT_MODEL_PATH": str(ROOT / "var" / "models" / "SmolLM2-135M-Instruct"),
        "CHAT_ENGINE": "threads=1",
    }
    started: list[LiveServer] = []

    def start() -> LiveServer:
        server = LiveServer(tmp_path, serve=True, **env)
        for name in ("REDIS_URL", "CHAT_CACHE_REDIS_URL"):  # unset: `make run` defaults
            server.env.pop(name, None)
        started.append(server.start())
        return server

    embedded = EmbeddedRedis(data)
    yield embedded, start
    for server in started:
        server.stop()
    if (embedded.home / "redis.pid").exists() and running(redis_pid(embedded)):
        os.kill(redis_pid(embedded), signal.SIGKILL)  # never leave one running after a failure


async def test_two_servers_share_it_and_the_last_one_out_stops_it(checkout):
    """Two `project.serve` on one checkout: one redis-server with two leases. The second one
    stopping leaves it running: the first stays healthy (cache and all) and answers; a killed
    Redis is started again by the survivor and the cache works again; the last one stops it."""
    embedded, start = checkout
    first = start()
    server_pid = redis_pid(embedded)
    second = start()
    assert redis_pid(embedded) == server_pid  # joined, not started again
    assert {lease.split()[0] for lease in embedded.users()} == {
        str(first.process.pid),
        str(second.process.pid),
    }

    second.stop()
    assert second.process.returncode == 0
    assert running(server_pid) and embedded.answers()
    assert [lease.split()[0] for lease in embedded.users()] == [str(first.process.pid)]
    assert healthy(first), first.health()
    await ask(first)

    os.kill(server_pid, signal.SIGKILL)
    wait_for(lambda: not running(server_pid), "the killed redis-server is gone")
    # Right after the kill /healthz says so (it asks Redis, whatever the back-off).
    wait_for(lambda: healthy(first) and redis_pid(embedded) != server_pid, "Redis is back")
    assert "embedded Redis on" in first.log() and "starting it again" in first.log()
    prompt = "Count from 1 to 4, separated by commas."
    answered = await ask(first, prompt)
    if answered["finish_reason"] == "eos":  # only answers that ended normally are cached
        assert (await ask(first, prompt))["cached"]

    restarted = redis_pid(embedded)
    first.stop()
    assert first.process.returncode == 0
    wait_for(lambda: not running(restarted), "the last user stopped Redis", timeout=15)
    assert embedded.users() == set()


def test_a_lease_of_a_dead_process_does_not_keep_it_running(tmp_path):
    """A server killed without releasing leaves its lease; the next last user stops Redis anyway."""
    embedded = EmbeddedRedis(tmp_path)
    embedded.acquire()
    pid = redis_pid(embedded)
    try:
        dead = psutil.Popen(["true"])
        dead.wait()
        with (embedded.home / "users").open("a") as users:
            users.write(f"{dead.pid} 12345.0\n")  # gone, or a reused pid with another start time
            users.write(f"{os.getppid()} 1.0\n")  # alive, but not the process that took the lease
        assert len(embedded.users()) == 1
        assert embedded.release() is True
        wait_for(lambda: not running(pid), "stopped", timeout=15)
    finally:
        if running(pid):
            os.kill(pid, signal.SIGKILL)
