"""The web tier in front of a real engine nobody here wrote: a live daphne on CHAT_BACKEND=openai
against `transformers serve --continuous-batching` (the `peer` fixture) with the bundled model.

The scripted fake (harness/openai_server.py) keeps the failures a real engine does not produce on
demand; this file keeps what only a real one shows. Answers are a few tokens each.
"""

from __future__ import annotations

import json
import time

import jsonschema
import pytest
import websockets

from .conftest import LIVE_CACHE_URL
from .test_live import receive_until_done

pytestmark = pytest.mark.integration

COUNT = "Count from 1 to 10, separated by commas."
# Greedy, the bundled model writes numbers past 300 tokens without an end (measured on the peer):
# an answer that cannot end by itself before the engine-idle check gives up.
ENDLESS = "Write the numbers from 1 to 1000, separated by commas, with nothing else."
POLICIES = """
from chat.models import OutputPolicy as P
for slug, fields in {
    "upto3": dict(mode="stream", stop_strings=[", 3"], max_new_tokens=20),
    "brief": dict(mode="stream", max_new_tokens=5),
    "endless": dict(mode="stream", max_new_tokens=2048),
}.items():
    P.objects.get_or_create(slug=slug, defaults=dict(name=slug, cache_enabled=False, **fields))
"""


@pytest.fixture(scope="module")
def web(peer, tmp_path_factory):
    """A daphne that loads no model, one upstream stream at a time (more users than slots)."""
    from harness.liveserver import LiveServer

    server = LiveServer(
        tmp_path_factory.mktemp("real-engine"),
        CHAT_CACHE_REDIS_URL=LIVE_CACHE_URL,
        CHAT_BACKEND="openai",
        CHAT_REMOTE=f"{peer.base_url}?model={peer.model}&concurrency=1",
        CHAT_LIMITS="new_tokens_cap=2048",
    ).start()
    server.manage("shell", "-c", POLICIES)
    yield server
    server.stop()


def cpu_ticks(pid: int) -> int:
    """User plus system CPU time of a process, all its threads, in clock ticks (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def engine_goes_idle(pid: int, within: float) -> bool:
    """True once a one-second window shows the engine process (nearly) off the CPU.

    A generating `transformers serve` keeps a core busy (about 100 ticks a second); idle it
    takes none. `within` is a hang guard shorter than the 2048-token answer it would finish.
    """
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        before = cpu_ticks(pid)
        time.sleep(1.0)
        if cpu_ticks(pid) - before < 20:
            return True
    return False


async def ask(server, text: str, policy: str | None = None, request_id: str = "a") -> list[dict]:
    async with websockets.connect(server.ws_url, origin=server.url) as ws:
        frame = {"type": "prompt", "request_id": request_id, "text": text}
        if policy:
            frame["policy"] = policy
        await ws.send(json.dumps(frame))
        return await receive_until_done(ws, request_id)


def test_the_web_tier_loads_no_torch_and_is_healthy_beside_a_failing_model_list(web, peer):
    """/healthz is ok (not degraded) although the peer's /v1/models answers 500; what the peer
    accepts was found at start-up and logged in one line; daphne never mapped libtorch."""
    status, health = web.health()
    assert status == 200 and health["status"] == "ok" and health["upstream_status"] == "ok"
    found = health["upstream_capabilities"]
    assert "models endpoint HTTP 500" in found and "stop ignored" in found
    assert "refused fields min_tokens, stop_token_ids" in found
    log = web.log_path.read_text(errors="replace")
    assert log.count(f"Upstream {peer.base_url}:") == 1
    with open(f"/proc/{web.pid}/maps") as maps:
        assert "libtorch" not in maps.read()


async def test_streaming_stop_strings_and_length_through_the_real_engine(web):
    """Chunks assemble to the answer; a stop string the peer streams through is cut here and
    ends the answer as stop_string; max_new_tokens ends it as length."""
    streamed = await ask(web, COUNT, "upto3")
    done = streamed[-1]
    chunks = [e["text"] for e in streamed if e["type"] == "chunk"]
    assert done["type"] == "done" and done["finish_reason"] == "stop_string"
    assert len(chunks) > 1 and "".join(chunks) == done["text"]
    assert done["text"].strip() and ", 3" not in done["text"]

    short = (await ask(web, "Write a very long story about a dragon.", "brief"))[-1]
    assert short["finish_reason"] == "length" and short["metrics"]["new_tokens"] == 5


async def test_a_schema_policy_is_held_and_validated_here_when_the_engine_ignores_the_schema(web):
    """The peer ignores response_format: the `json` policy's answer is held (no chunk), parsed
    and checked against its schema here (re-asking if it must) before anyone sees it."""
    import importlib

    schema = importlib.import_module("chat.migrations.0003_example_policies").JSON["json_schema"]
    events = await ask(web, "What color is grass?", "json")
    kinds = [e["type"] for e in events]
    done = events[-1]
    assert "buffering" in kinds and "chunk" not in kinds
    assert done["type"] == "done" and done["finish_reason"] in ("eos", "length"), done
    jsonschema.validate(done["json"], schema)


async def test_a_second_user_waits_with_its_position_and_a_cancel_stops_the_engine(web, peer):
    """One upstream slot, two users: the second is told position 1 behind a running answer.
    Cancelling that answer closes its stream; the engine stops generating (its CPU goes idle
    long before 2048 tokens could end) and the second user is served."""
    async with (
        websockets.connect(web.ws_url, origin=web.url) as first,
        websockets.connect(web.ws_url, origin=web.url) as second,
    ):
        await first.send(
            json.dumps(
                {
                    "type": "prompt",
                    "request_id": "long",
                    "text": ENDLESS,
                    "policy": "endless",
                }
            )
        )
        while json.loads(await first.recv())["type"] != "chunk":
            pass
        await second.send(
            json.dumps({"type": "prompt", "request_id": "next", "text": COUNT, "policy": "brief"})
        )
        accepted = json.loads(await second.recv())
        await first.send(json.dumps({"type": "cancel", "request_id": "long"}))
        cancelled = await receive_until_done(first, "long")
        served = await receive_until_done(second, "next")

    assert accepted["type"] == "accepted" and accepted["queue_position"] == 1
    assert cancelled[-1]["finish_reason"] == "cancelled"
    assert served[-1]["type"] == "done" and served[-1]["finish_reason"] in {"eos", "length"}
    assert engine_goes_idle(peer.pid, within=20)
