"""What the turn (chat/turns/) does around generation, on a scripted backend: re-asks,
retractions, the cache, storage and failures, each in milliseconds. The same paths run on the real model elsewhere."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from chat.engine.local.backend import LocalBackend
from chat.engine.local.scheduler import ContinuousScheduler
from chat.engine.remote.concurrent import ConcurrentScheduler
from chat.engine.remote.openai_backend import OpenAIBackend, RemoteConfig
from chat.engine.types import Backend, Scheduler, SteppedBackend
from chat.models import Message
from chat.protocol import FINISH_REASONS, METRIC_KEYS
from harness.scripted import Answer, ScriptedBackend
from tests.conftest import ChatClient, chunks_text

ws_db = pytest.mark.django_db(transaction=True)

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1}},
    "required": ["answer"],
}


@pytest.fixture
async def chat():
    from project.asgi import application

    client = await ChatClient(application).connect()
    yield client
    await client.close()


async def ask(chat: ChatClient, text: str, **extra) -> list[dict]:
    request_id = await chat.prompt(text, **extra)
    return await chat.receive_until("done", request_id, timeout=10)


@pytest.mark.integration
def test_every_backend_and_scheduler_implements_the_engine_protocols(runtime):
    """The written contract in chat/engine/types.py holds for each implementation and the script."""
    remote = OpenAIBackend(RemoteConfig(base_url="http://127.0.0.1:9/v1", model="m"))
    for backend in (ScriptedBackend([]), remote, runtime.backend):
        assert isinstance(backend, Backend), type(backend).__name__
    assert isinstance(runtime.backend, SteppedBackend)
    for method in ("render", "encode", "generate", "generate_batch", "new_batch", "row", "result"):
        assert callable(getattr(LocalBackend, method))
    assert not isinstance(remote, SteppedBackend)  # the remote server steps its own model
    schedulers = [ContinuousScheduler(runtime.backend), ConcurrentScheduler(remote)]
    try:
        for scheduler in schedulers:
            assert isinstance(scheduler, Scheduler), type(scheduler).__name__
    finally:
        for scheduler in schedulers:
            scheduler.close()
    assert not isinstance(object(), Backend) and not isinstance(object(), Scheduler)


@pytest.mark.unit
@ws_db
async def test_a_cached_and_a_live_done_carry_the_same_keys(scripted, chat, make_policy):
    """A repeat is served from the cache with exactly the keys a live `done` has, metrics included."""
    await sync_to_async(make_policy)(slug="cached", cache_enabled=True)
    backend = scripted(Answer(("Hello", ", world.")))
    live = (await ask(chat, "Say hello.", policy="cached"))[-1]
    cached = (await ask(chat, "Say hello.", policy="cached"))[-1]
    assert len(backend.requests) == 1  # the second answer generated nothing
    assert live["cached"] is False and cached["cached"] is True
    assert set(live) == set(cached)
    assert set(live["metrics"]) == set(cached["metrics"]) == set(METRIC_KEYS)
    assert cached["text"] == live["text"] == "Hello, world."
    assert cached["metrics"]["prompt_tokens"] == live["metrics"]["prompt_tokens"] > 0
    assert cached["metrics"]["cached_new_tokens"] == live["metrics"]["new_tokens"] == 2
    assert live["metrics"]["cached_new_tokens"] is None


@pytest.mark.unit
@ws_db
async def test_an_invalid_structured_answer_is_reasked_with_the_error_and_never_shown(
    scripted, chat, make_policy
):
    """Buffer mode: the first answer fails its schema, the re-ask names the problem, the second passes."""
    # Uncached: a cacheable turn's scheduler sees a shared copy of its request, with a flag of
    # its own (engine/sharing/coalescing.py; tests/test_coalescing.py covers a Stop there).
    await sync_to_async(make_policy)(
        slug="strict", mode="buffer", json_schema=ANSWER_SCHEMA, max_retries=1, cache_enabled=False
    )
    backend = scripted(Answer(('{"answer": ', '""}')), Answer(('{"answer": "Paris"}',)))
    events = await ask(chat, "Capital of France?", policy="strict")
    done = events[-1]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "accepted" and "buffering" in kinds and "chunk" not in kinds
    assert done["json"] == {"answer": "Paris"} and done["finish_reason"] == "eos"
    assert done["metrics"]["retries"] == 1 and done["metrics"]["new_tokens"] == 3
    reask = backend.requests[1].messages
    assert reask[-2] == {"role": "assistant", "content": '{"answer": ""}'}
    assert reask[-1]["role"] == "user" and "answer" in reask[-1]["content"]
    assert backend.requests[1].cancel is backend.requests[0].cancel  # one Stop stops both
    stored = await Message.objects.aget(pk=done["message"])
    assert stored.json_value == {"answer": "Paris"} and stored.retries == 1


@pytest.mark.unit
@ws_db
async def test_an_answer_that_stays_invalid_ends_the_policys_way(scripted, chat, make_policy):
    """After the last re-ask the failure action applies: here the fallback text, marked invalid."""
    await sync_to_async(make_policy)(
        slug="fallback",
        mode="buffer",
        json_schema=ANSWER_SCHEMA,
        max_retries=1,
        failure_action="fallback",
        fallback_text="Sorry, no valid answer.",
    )
    scripted(Answer(("nope",)), Answer(("still nope",)))
    done = (await ask(chat, "Capital?", policy="fallback"))[-1]
    assert done["finish_reason"] == "invalid" and done["text"] == "Sorry, no valid answer."
    assert done["json"] is None and done["reason"]


@pytest.mark.unit
@ws_db
async def test_a_moderated_stream_is_retracted_stopped_and_stored_empty(
    scripted, chat, make_policy
):
    """A blocklisted word mid-stream: `retract`, generation stops, and nothing is kept as the answer."""
    await sync_to_async(make_policy)(slug="clean", blocklist_terms="forbidden")
    backend = scripted(
        # The hook reads the text every 64 new characters: the word arrives well before that.
        Answer(
            ("This is fine. " * 6, "Now a forbidden word. ", "More. " * 12), wait_for_cancel=True
        )
    )
    events = await ask(chat, "Say something.", policy="clean")
    kinds = [e["type"] for e in events]
    assert "retract" in kinds and kinds.index("retract") < kinds.index("done")
    done = events[-1]
    assert done["finish_reason"] == "moderated" and done["text"] == ""
    assert backend.requests[0].cancel.is_set()  # the model was stopped, not left running
    stored = await Message.objects.aget(pk=done["message"])
    assert stored.text == "" and stored.outcome == "moderated"


@pytest.mark.unit
@ws_db
async def test_a_model_failure_keeps_the_partial_text_and_says_so(scripted, chat):
    """The chunks already shown are stored with the failure; the client gets `model_error`."""
    scripted(Answer(("Partial ", "answer"), fail=True), Answer(("Next one.",)))
    request_id = await chat.prompt("Hi")
    events = await chat.receive_until("error", request_id, timeout=10)
    assert events[-1]["code"] == "model_error"
    assert chunks_text(events) == "Partial answer"
    message = await Message.objects.filter(role="assistant").alatest("id")
    assert message.status == Message.Status.FAILED and message.text == "Partial answer"
    done = (await ask(chat, "Again"))[-1]  # the queue goes on
    assert done["text"] == "Next one." and done["finish_reason"] in FINISH_REASONS
