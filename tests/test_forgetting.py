"""A deleted conversation leaves nothing in the engine: its prefix KV is forgotten in every
process, so a probe cannot find out that someone's conversation began like its guess, and its
shared generations' events leave Redis, unless another living conversation shares them."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from dataclasses import replace
from types import SimpleNamespace

import pytest
import redis
from channels.layers import get_channel_layer
from django.test import AsyncClient

from chat import turns
from chat.engine.local.prefix_store import PrefixStore
from chat.engine.sharing.coalescing import Coalescer
from chat.engine.sharing.coalescing_across import AcrossProcesses
from chat.engine.sharing.generation_registry import PREFIX, GenerationRegistry, generation_id
from chat.infra.runtime import runtime as chat_runtime
from chat.turns.cancel_bus import GROUP, Forget
from chat.turns.forgetting import conversation_tag
from tests.conftest import LIVE_CACHE_URL, TEST_CACHE_URL
from tests.test_consumer import SHORT, new_session_key
from tests.test_generation_registry import Listener, ScriptedScheduler, event, play, request
from tests.test_prefix_reuse import kv

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "My locker code is 4471-ZEBRA. Say OK."


def tagged(store: PrefixStore, tag: str) -> list:
    return [entry for entry in store._entries.values() if tag in entry.tags]


def generation_keys(client: redis.Redis) -> list[str]:
    return sorted(key.decode() for key in client.scan_iter(f"{PREFIX}*"))


# -- the prefix store's bookkeeping ------------------------------------------------------------


@pytest.mark.unit
def test_an_entry_carries_the_tag_of_every_request_whose_ids_it_holds_whole():
    """Stored, found already held, or replaced by a longer row: each request's tag stays on the
    entry holding its ids; untagged and unrelated entries carry none of them."""
    store = PrefixStore(1 << 20)
    assert store.put([1, 2, 3], *kv(3), tags=("a",))
    assert not store.put([1, 2], *kv(2), tags=("b",))  # already held: the entry takes b
    assert store.put([1, 2, 3, 4], *kv(4), tags=("c",))  # extends it: a and b carry over
    assert store.put([9, 9], *kv(2))  # untagged (no conversation)
    assert store.put([1, 5], *kv(2), tags=("d",))  # shares [1] only
    tags = {tuple(entry.ids.tolist()): entry.tags for entry in store._entries.values()}
    assert tags == {(1, 2, 3, 4): {"a", "b", "c"}, (9, 9): set(), (1, 5): {"d"}}


@pytest.mark.unit
def test_forgetting_a_tag_drops_its_entries_and_refuses_it_from_then_on():
    """forget drops every entry filed under the tag, nothing else; a row of that conversation
    still running when it was deleted cannot store it again."""
    store = PrefixStore(1 << 20)
    store.put([1, 2, 3], *kv(3), tags=("a",))
    store.put([1, 2, 7, 8], *kv(4), tags=("b",))
    store.put([4, 4], *kv(2))
    assert store.forget(["a", "unknown"]) == 1
    assert store.longest([1, 2, 3], 3)[0] == 2  # what b typed too, and no more
    assert {tuple(e.ids.tolist()) for e in store._entries.values()} == {(1, 2, 7, 8), (4, 4)}
    assert not store.put([1, 2, 3, 5], *kv(4), tags=("a",))
    assert store.longest([1, 2, 3, 5], 4)[0] == 2
    assert store.forget(["b"]) == 1 and len(store) == 1 and store.forgotten == 2
    assert store.nbytes == store._entries[next(iter(store._entries))].nbytes


# -- the shared generations' events in Redis ---------------------------------------------------


@pytest.fixture
def registry():
    registry = GenerationRegistry(TEST_CACHE_URL, lease_seconds=5)
    yield registry
    registry.close()


@pytest.mark.unit
def test_a_finished_generation_is_forgotten_with_its_events_and_filing(registry):
    """Its events stay a minute after the answer for late listeners; forgetting its one tag
    deletes them, the ownership, the listeners and the filing at once."""
    assert registry.claim("g", "owner", "owner", "a")
    registry.publish("g", "owner", [event(0, "started"), event(1, text="4471")], tag="a")
    registry.publish("g", "owner", [event(2, "finished")], final=True, tag="a")
    assert registry.read("g") and registry.tags("g") == {"a"}
    assert registry.forget("a") == 1
    assert generation_keys(registry.client) == []


@pytest.mark.unit
def test_a_generation_held_by_another_conversation_keeps_its_events(registry):
    """Two conversations' identical prompts shared one generation: forgetting the first keeps
    the events the second is reading; forgetting the second deletes them. The first tag is never
    filed again by the owner's later publishes."""
    assert registry.claim("g", "owner", "owner", "a")
    assert not registry.claim("g", "other", "other", "b")
    registry.publish("g", "owner", [event(0, "started")], tag="a")
    assert registry.forget("a") == 0
    registry.publish("g", "owner", [event(1, text="hi")], tag="a")
    assert registry.renew("g", "other", "b")
    assert registry.tags("g") == {"b"} and len(registry.read("g")) == 2
    assert registry.forget("a") == 0
    assert registry.forget("b") == 1
    assert generation_keys(registry.client) == []
    # The owner, still running, finds its lease gone and adds nothing any more.
    assert registry.publish("g", "owner", [event(2, text="!")], tag="a") == -1
    assert registry.read("g") == []


@pytest.mark.unit
def test_an_old_tag_never_deletes_a_fresh_generation_of_the_same_prompt(registry):
    """A tag still filed on an older generation of the same id leaves a new claim (another
    conversation's, or an untagged one) alone."""
    registry.claim("g", "first", "first", "a")
    registry.publish("g", "first", [event(0, "finished")], final=True, tag="a")
    assert registry.claim("g", "second", "second")  # finished: claimed anew, untagged
    registry.publish("g", "second", [event(0, "started")])
    assert registry.forget("a") == 0
    assert len(registry.read("g")) == 1


@pytest.mark.unit
def test_two_processes_file_one_generation_under_both_conversations():
    """Over AcrossProcesses, as the turns use it: the owner's and the follower's requests file
    the generation under their own tags; forgetting the owner's conversation leaves the
    follower's answer whole."""
    scheduler = ScriptedScheduler()
    a, b = Coalescer(), Coalescer()
    a.across = AcrossProcesses(lambda: TEST_CACHE_URL, lease_seconds=5)
    b.across = AcrossProcesses(lambda: TEST_CACHE_URL, lease_seconds=5)
    owner, follower = Listener(), Listener()
    a.sharing(scheduler, "key").submit(replace(request(), tag="a"), owner)
    play(scheduler.tickets[0], "Once ", start=True)
    b.sharing(scheduler, "key").submit(replace(request(), tag="b"), follower)
    assert follower.chunk.wait(10)
    registry = a.across.registry()
    generation = generation_id("key", request().input_ids)
    assert registry.tags(generation) == {"a", "b"}
    assert registry.forget("a") == 0
    play(scheduler.tickets[0], "upon a time.", end="Once upon a time.")
    assert follower.done.wait(10) and follower.text == "Once upon a time."
    assert registry.forget("b") == 1 and registry.read(generation) == []


# -- the bus -------------------------------------------------------------------------------------


@pytest.mark.unit
async def test_a_deletion_is_heard_by_every_process_and_names_no_conversation(monkeypatch):
    """The deletion forgets here, then publishes opaque tags only (no conversation id); another
    process hearing it drops its own prefix entries of that conversation, and only those."""
    gone, kept = conversation_tag(41), conversation_tag(42)

    def process_store() -> PrefixStore:
        store = PrefixStore(1 << 20)
        store.put([1, 2, 3], *kv(3), tags=(gone,))
        store.put([1, 2, 4], *kv(3), tags=(kept,))
        monkeypatch.setattr(chat_runtime, "backend", SimpleNamespace(prefix_store=store))
        return store

    here = process_store()
    layer = get_channel_layer()
    spy = await layer.new_channel(prefix="spy")
    await layer.group_add(GROUP, spy)
    try:
        await asyncio.to_thread(turns.conversations_forget, [41])
        while True:  # other suites on the same Redis may publish to the group too
            message = await asyncio.wait_for(layer.receive(spy), 10)
            if message["type"] == Forget.kind:
                break
    finally:
        await layer.group_discard(GROUP, spy)
    assert message == {"type": "conversation.forget", "tags": [gone]}
    assert tagged(here, gone) == [] and len(tagged(here, kept)) == 1
    elsewhere = process_store()
    turns.cancel_bus._hand_over(message)  # what another process's listener does with it
    assert tagged(elsewhere, gone) == [] and len(tagged(elsewhere, kept)) == 1


# -- the real model, in process ------------------------------------------------------------------


def reused_tokens(metrics: str) -> float:
    found = re.search(r'^chat_prefill_tokens_total\{source="reused"\} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.integration
async def test_a_deleted_conversation_leaves_no_prefix_to_probe_and_no_events(
    make_client, runtime, example_policies, scrape_metrics
):
    """A visitor asks something private and deletes the conversation on the page. Nothing of it
    stays: no prefix entry under its tag, no shared generation in Redis; and a stranger sending
    the very same words reuses no more than the chat template's opening that another visitor's
    conversation holds too, as if the first had never asked."""
    store = runtime.backend.prefix_store
    session_key = await new_session_key()
    visitor = await make_client(session_key=session_key)
    other, stranger = await make_client(), await make_client()
    asked = await visitor.receive_until("done", await visitor.prompt(SECRET, policy="chat"))
    conversation, prompt_tokens = asked[0]["conversation"], asked[-1]["metrics"]["prompt_tokens"]
    await other.receive_until("done", await other.prompt(SHORT, policy="chat"))
    tag = conversation_tag(conversation)
    held = tagged(store, tag)
    assert held, "the turn's KV is filed under its conversation"
    secret_ids = max((entry.ids.tolist() for entry in held), key=len)  # prompt and answer
    assert store.longest(secret_ids, len(secret_ids))[0] == len(secret_ids)
    cache = redis.Redis.from_url(TEST_CACHE_URL)
    generations = [g.decode() for g in cache.smembers(f"{PREFIX}tag:{tag}")]
    assert generations and all(cache.exists(f"{PREFIX}{g}:events") for g in generations)

    page = AsyncClient()
    page.cookies["sessionid"] = session_key
    assert (await page.delete(f"/api/conversations/{conversation}/")).status_code == 204

    assert tagged(store, tag) == []
    left = store.longest(secret_ids, len(secret_ids))[0]
    assert left < prompt_tokens  # nothing of what the visitor typed, only the template's opening
    assert not [key for key in generation_keys(cache) if any(g in key for g in generations)]
    assert not cache.exists(f"{PREFIX}tag:{tag}")
    before = reused_tokens(await scrape_metrics())
    probe = await stranger.receive_until("done", await stranger.prompt(SECRET, policy="chat"))
    assert probe[-1]["cached"] is False  # the cached answer went with the conversation too
    assert reused_tokens(await scrape_metrics()) - before <= left


@pytest.mark.integration
def test_rows_that_share_an_opening_are_forgotten_one_conversation_at_a_time(backend):
    """On the real model's running batch: two conversations prefilled together share their
    common opening once; forgetting one leaves the other's KV (and the opening it typed too)
    reusable, forgetting both leaves nothing of either."""
    from tests.test_prefix_reuse import batch_for, run

    store = PrefixStore(64 * 1024 * 1024)
    opening = [{"role": "system", "content": "You answer in one short sentence about the sea."}]
    first = backend.request(opening + [{"role": "user", "content": SECRET}], max_new_tokens=4)
    second = backend.request(opening + [{"role": "user", "content": SHORT}], max_new_tokens=4)
    first.tag, second.tag = "first", "second"
    rows = [backend.row(request, lambda text: None) for request in (first, second)]
    run(batch_for(backend, store), rows)
    shared = next(
        i for i, (a, b) in enumerate(zip(first.input_ids, second.input_ids, strict=False)) if a != b
    )
    assert shared >= 16 and tagged(store, "first") and tagged(store, "second")
    assert store.longest(first.input_ids, len(first.input_ids))[0] == len(first.input_ids)
    store.forget(["first"])
    assert tagged(store, "first") == []
    assert store.longest(first.input_ids, len(first.input_ids))[0] == shared
    assert store.longest(second.input_ids, len(second.input_ids))[0] == len(second.input_ids)
    store.forget(["second"])
    assert len(store) == 0


# -- live: a daphne on the real model, the conversations deleted by another process ---------------


@pytest.fixture(scope="module")
def live(daphne_server):
    """The session's daphne on the real model, and an API key of this module's user: (server,
    key)."""
    daphne_server.manage(
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model as U; "
        "U().objects.get_or_create(username='forgets')",
    )
    return daphne_server, daphne_server.manage(
        "apikey", "create", "--user", "forgets"
    ).splitlines()[-1]


def complete(server, key: str, messages: list[dict]) -> dict:
    """One /v1 chat completion, whole."""
    request = urllib.request.Request(
        server.url + "/v1/chat/completions",
        json.dumps({"model": "smollm2", "messages": messages, "max_tokens": 16}).encode(),
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def prefix_bytes(metrics: str) -> float:
    return float(re.search(r"^chat_prefix_cache_bytes (\S+)$", metrics, re.M).group(1))


@pytest.mark.integration
def test_live_conversations_deleted_by_another_process_leave_no_prefix_and_no_events(live):
    """Over a real daphne: a follow-up reuses what the first turn left (so the probe would see
    it); `manage.py shell`, another process, deletes every conversation; the daphne hears it on
    the bus and forgets, and the shared generations' events are gone from Redis; the same
    follow-up sent again reuses nothing of what was typed."""
    server, key = live
    asked = [{"role": "user", "content": SECRET}]
    first = complete(server, key, asked)
    typed = first["usage"]["prompt_tokens"]
    answer = first["choices"][0]["message"]["content"]

    def follow_up(text: str) -> float:
        """The prefill tokens the daphne reused for a follow-up of the first turn."""
        before = reused_tokens(server.metrics())
        messages = asked + [{"role": "assistant", "content": answer}]
        complete(server, key, messages + [{"role": "user", "content": text}])
        return reused_tokens(server.metrics()) - before

    assert follow_up("Again?") >= typed  # the probe works: the first turn's KV is there
    cache = redis.Redis.from_url(LIVE_CACHE_URL)
    assert [k for k in generation_keys(cache) if k.endswith(":events")]
    held = prefix_bytes(server.metrics())
    server.manage(
        "shell",
        "-c",
        "from chat.models import Conversation as C; "
        "from chat.stores.erasure import conversations_erase as erase; "
        "erase(conversations=C.objects.all())",
    )
    deadline = time.monotonic() + 15
    while prefix_bytes(server.metrics()) >= held and time.monotonic() < deadline:
        time.sleep(0.2)
    assert prefix_bytes(server.metrics()) < held, "the daphne did not hear the deletion"
    assert generation_keys(cache) == []
    assert follow_up("Once more?") < typed
