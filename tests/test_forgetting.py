"""What the engine keeps of a request is filed under its tag and can be forgotten: prefix KV
entries, and a shared generation's events in Redis unless another tag still holds them."""

from __future__ import annotations

import pytest
import redis

from chat.engine.coalescing import Coalescer
from chat.engine.coalescing_across import AcrossProcesses
from chat.engine.generation_registry import PREFIX, GenerationRegistry, generation_id
from chat.engine.prefix_store import PrefixStore
from chat.engine.types import GenerationRequest
from tests.conftest import TEST_CACHE_URL
from tests.test_generation_registry import Listener, ScriptedScheduler, event, play
from tests.test_prefix_reuse import kv


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
    ids = [1, 2, 3, 4]
    a.sharing(scheduler, "key").submit(GenerationRequest(ids, 8, tag="a"), owner)
    play(scheduler.tickets[0], "Once ", start=True)
    b.sharing(scheduler, "key").submit(GenerationRequest(ids, 8, tag="b"), follower)
    assert follower.chunk.wait(10)
    registry = a.across.registry()
    generation = generation_id("key", ids)
    assert registry.tags(generation) == {"a", "b"}
    assert registry.forget("a") == 0
    play(scheduler.tickets[0], "upon a time.", end="Once upon a time.")
    assert follower.done.wait(10) and follower.text == "Once upon a time."
    assert registry.forget("b") == 1 and registry.read(generation) == []
