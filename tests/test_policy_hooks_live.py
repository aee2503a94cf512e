"""The hold-back window and masks over the real socket: the real model where the path is the
user's, a scripted one where the exact personal data in the answer must be known."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import sync_to_async

from chat.infra import behaviour
from chat.models import Message
from harness.scripted import Answer
from tests.conftest import ChatClient, chunks_text

ws_db = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def chat(application):
    client = await ChatClient(application).connect()
    yield client
    await client.close()


async def ask(chat: ChatClient, text: str, **extra) -> list[dict]:
    request_id = await chat.prompt(text, **extra)
    return await chat.receive_until("done", request_id, timeout=120)


@pytest.mark.integration
@ws_db
async def test_a_blocked_term_inside_the_window_never_reaches_the_client(chat, make_policy):
    """Real model, W = 24: "12" is caught while still held back: withdrawn, never sent."""
    await sync_to_async(make_policy)(
        slug="held", mode="stream", blocklist_terms="12", holdback_chars=24, max_new_tokens=120
    )
    events = await ask(chat, "Count from 1 to 50, separated by commas.", policy="held")
    kinds = [e["type"] for e in events]
    assert "retract" in kinds and events[-1]["finish_reason"] == "moderated"
    assert re.search(r"(?<!\w)12(?!\w)", chunks_text(events)) is None
    stored = await Message.objects.aget(pk=events[-1]["message"])
    assert stored.text == "" and "12" in stored.raw_text  # kept for review, never shown


@pytest.mark.integration
@ws_db
async def test_the_window_delays_only_the_first_characters_of_a_clean_answer(chat, make_policy):
    """Real model, W = 32, nothing to catch: the whole answer arrives, as chunks then `done`."""
    await sync_to_async(make_policy)(slug="late", holdback_chars=32, max_new_tokens=24)
    events = await ask(chat, "Say hello.", policy="late")
    done = events[-1]
    assert done["finish_reason"] in ("eos", "length") and done["text"]
    assert chunks_text(events) == done["text"]
    assert done["metrics"]["ttfv_ms"] >= done["metrics"]["ttft_ms"]


@pytest.mark.integration
@ws_db
async def test_masked_personal_data_is_what_streams_stores_and_caches(scripted, chat, make_policy):
    """A mask with the policy's window at 0: raw text never reaches the socket, the database or
    the cache; the repeat is served from the cache, masked."""
    await sync_to_async(make_policy)(
        slug="private",
        moderation_hooks=[{"hook": "personal_data", "settings": {"action": "mask"}}],
        cache_enabled=True,
    )
    answer = "Write to jane.doe@example.com or call +44 20 7946 0958, any time. Thanks!"
    pieces = [answer[i : i + 3] for i in range(0, len(answer), 3)]
    backend = scripted(Answer(tuple(pieces), "eos"))
    events = await ask(chat, "How do I reach Jane?", policy="private")
    masked = "Write to [email] or call [phone], any time. Thanks!"
    done = events[-1]
    assert done["finish_reason"] == "eos" and done["text"] == masked
    assert chunks_text(events) == masked and "retract" not in [e["type"] for e in events]
    stored = await Message.objects.aget(pk=done["message"])
    assert stored.text == masked and stored.raw_text == masked
    # The raw text is gone, so the answer's metrics are what says it was masked (the admin's
    # behaviour page counts it as masked, not delivered).
    assert "email" in done["metrics"]["masked"] and stored.metrics["masked"]
    rows, _ = await sync_to_async(behaviour.fetch_answers)(stored.created_at, stored.created_at)
    [row] = [r for r in rows if r[1] == stored.policy_id]
    assert behaviour.kinds_of(*row[4:9]) == {"masked"}
    repeat = (await ask(chat, "How do I reach Jane?", policy="private"))[-1]
    assert repeat["cached"] is True and repeat["text"] == masked and len(backend.requests) == 1


@pytest.mark.integration
@ws_db
async def test_personal_data_blocked_is_withdrawn(scripted, chat, make_policy):
    """action `block`: the answer is withdrawn like any veto, the reason says which kind."""
    await sync_to_async(make_policy)(
        slug="nocards",
        moderation_hooks=[{"hook": "personal_data", "settings": {"action": "block"}}],
        holdback_chars=40,
    )
    answer = "Sure, use the card 4111 1111 1111 1111 for the test payment, it always works."
    scripted(Answer(tuple(answer[i : i + 4] for i in range(0, len(answer), 4)), "eos"))
    events = await ask(chat, "Give me a test card.", policy="nocards")
    assert events[-1]["finish_reason"] == "moderated" and "card" in events[-1]["reason"]
    assert "4111" not in chunks_text(events)
