"""Review that means what it says: an approval covers exactly the text the reviewer read, a new
generation never overwrites a pending or edited record, and rejecting or evicting is durable
and stops serving at once, even while Redis keeps the entry.

Real database (SQLite or PostgreSQL), real Redis, the real admin through Django's test client
as staff with the review permission; the last test asks the real model over the socket.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Permission, User
from django.db import OperationalError, connection
from django.test import Client

from chat.models import CachedAnswer, Conversation, OutputPolicy, PendingEviction
from chat.stores import evictions, review
from chat.stores.cache import KEY_PREFIX, completion_cache
from harness.liveserver import free_port
from tests.conftest import TEST_CACHE_URL
from tests.test_cache import admin_client, ask, run_action, seen_digest

real_db = pytest.mark.django_db(transaction=True)  # committed, so other threads see it

KEY = "a" * 64
FIRST, SECOND = "The first answer, as the model wrote it.", "A second generation's answer."


# -- helpers ---------------------------------------------------------------------------


def policy(*, review_required: bool) -> OutputPolicy:
    slug = "reviewed" if review_required else "open"
    return OutputPolicy.objects.create(name=slug, slug=slug, require_review=review_required)


def remember(answer_policy: OutputPolicy, text: str, key: str = KEY) -> CachedAnswer | None:
    """A generation of `key` ending well, recorded as the turn records it."""
    return review.answer_remember(
        key=key,
        conversation_id=Conversation.objects.create().pk,
        prompt="What is kept?",
        rendered_prompt="<user>What is kept?",
        text=text,
        json_value=None,
        finish_reason="eos",
        metrics={"new_tokens": len(text.split())},
        policy_id=answer_policy.pk,
        policy_slug=answer_policy.slug,
        policy_version=answer_policy.version,
        model_id="m",
        require_review=answer_policy.require_review,
    )


def reviewer(name: str) -> Client:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    for codename in ("view_cachedanswer", "review_cachedanswer"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def open_page(client: Client, record: CachedAnswer) -> str:
    """The answer's admin page as the reviewer reads it; the digest of the text it shows."""
    page = client.get(f"/admin/chat/cachedanswer/{record.pk}/change/")
    assert page.status_code == 200
    return seen_digest(page.content.decode())


def approve(client: Client, record: CachedAnswer, digest: str, **typed) -> list[str]:
    """Press Approve on a page that showed `digest`; the messages the admin answered with."""
    response = client.post(
        f"/admin/chat/cachedanswer/{record.pk}/approve/",
        {"seen_digest": digest, **typed},
        follow=True,
    )
    assert response.status_code == 200
    return [str(message) for message in response.context["messages"]]


def edit(client: Client, record: CachedAnswer, text: str, digest: str):
    return client.post(
        f"/admin/chat/cachedanswer/{record.pk}/change/",
        {"answer": text, "seen_digest": digest},
        follow=True,
    )


def in_redis(key: str = KEY) -> dict | None:
    return completion_cache.get(key)


def redis_down(settings, monkeypatch) -> None:
    """The cache's Redis unreachable: nothing listens on its port, and no back-off hides it."""
    monkeypatch.setattr(completion_cache, "backoff_seconds", 0.0)
    settings.CHAT_CACHE_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"


def raw_entry(key: str = KEY) -> dict | None:
    """What the test Redis holds for `key`, read past the product's client."""
    import json

    client = redis.Redis.from_url(TEST_CACHE_URL)
    try:
        raw = client.get(KEY_PREFIX + key)
    finally:
        client.close()
    return json.loads(raw) if raw else None


# -- an approval covers what was read ----------------------------------------------------


@pytest.mark.unit
@real_db
def test_an_approval_of_a_text_edited_after_the_page_was_loaded_is_refused():
    """Reviewer A reads the answer; reviewer B edits it; A's Approve (with the old digest) is
    refused and nothing is published. A, reading the new text, can approve it."""
    record = remember(policy(review_required=True), FIRST)
    alice, bob = reviewer("alice"), reviewer("bob")
    read_by_alice = open_page(alice, record)
    assert edit(bob, record, "Bob's rewrite.", open_page(bob, record)).status_code == 200

    said = approve(alice, record, read_by_alice)
    assert any("Not approved: the answer changed" in line for line in said), said
    record.refresh_from_db()
    assert (record.status, record.answer, record.reviewed_by) == ("pending", "Bob's rewrite.", None)
    assert in_redis() is None

    approve(alice, record, open_page(alice, record))
    record.refresh_from_db()
    assert record.status == "approved" and in_redis()["text"] == "Bob's rewrite."


@pytest.mark.unit
@real_db
def test_an_approval_of_a_text_refilled_by_a_new_generation_is_refused():
    """Reviewer A reads the answer; B evicts it and a new generation refills the record with
    another text; A's Approve is refused and nothing is published."""
    record = remember(policy(review_required=True), FIRST)
    alice, bob = reviewer("alice"), reviewer("bob")
    read_by_alice = open_page(alice, record)
    bob.post("/admin/chat/cachedanswer/", {"action": "evict", "_selected_action": [record.pk]})
    remember(record.policy, SECOND)

    said = approve(alice, record, read_by_alice)
    assert any("Not approved: the answer changed" in line for line in said), said
    record.refresh_from_db()
    assert (record.status, record.answer) == ("pending", SECOND)
    assert in_redis() is None


@pytest.mark.unit
@real_db
def test_a_second_generation_of_a_pending_key_leaves_the_first_text_and_the_approval_publishes_it():
    """The page read before a second generation still approves: the record kept the first
    text (and its metrics), and that is what Redis serves."""
    record = remember(policy(review_required=True), FIRST)
    alice = reviewer("alice")
    read_by_alice = open_page(alice, record)
    remember(record.policy, SECOND)
    record.refresh_from_db()
    assert (record.answer, record.metrics) == (FIRST, {"new_tokens": len(FIRST.split())})

    said = approve(alice, record, read_by_alice)
    assert any(line.startswith("Approved") for line in said), said
    assert in_redis()["text"] == FIRST
    remember(record.policy, SECOND)  # approved stays approved, with its text
    record.refresh_from_db()
    assert (record.status, record.answer) == ("approved", FIRST)


@pytest.mark.unit
@real_db
def test_an_edited_record_is_never_overwritten_and_shows_as_edited():
    """An admin's text survives later generations (here under a policy without review, where it
    is served at once); the list shows who edited it and filters on it. Saving the page untouched
    (a browser posts CRLF line ends) writes nothing and marks nothing."""
    record = remember(policy(review_required=False), "Line one.\nLine two.")
    alice = reviewer("alice")
    unchanged = edit(alice, record, "Line one.\r\nLine two.", open_page(alice, record))
    assert unchanged.status_code == 200
    record.refresh_from_db()
    assert record.edited_at is None and record.answer == "Line one.\nLine two."

    edit(alice, record, "Alice's text.", open_page(alice, record))
    completion_cache.evict(KEY)  # its TTL ran out: the key is generated again
    remember(record.policy, SECOND)
    record.refresh_from_db()
    assert (record.answer, record.status, record.edited_by.username) == (
        "Alice's text.",
        "pending",
        "alice",
    )
    assert in_redis()["text"] == "Alice's text."
    listed = alice.get("/admin/chat/cachedanswer/?edited=yes").content.decode()
    assert "Alice&#x27;s text." in listed and "by alice" in listed
    assert (
        "Alice&#x27;s text."
        not in alice.get("/admin/chat/cachedanswer/?edited=no").content.decode()
    )


@pytest.mark.unit
@real_db
def test_an_edit_from_a_page_loaded_before_another_edit_is_refused():
    """Two admins edit the same answer from pages loaded together: the second save is refused
    with the form's error, so it cannot silently replace a text its author never saw."""
    record = remember(policy(review_required=True), FIRST)
    alice, bob = reviewer("alice"), reviewer("bob")
    read_by_alice, read_by_bob = open_page(alice, record), open_page(bob, record)
    edit(alice, record, "Alice's text.", read_by_alice)
    refused = edit(bob, record, "Bob's text.", read_by_bob)
    assert b"This answer changed since this page was loaded" in refused.content
    record.refresh_from_db()
    assert (record.answer, record.edited_by.username) == ("Alice's text.", "alice")


@pytest.mark.unit
@real_db
def test_an_edit_of_an_approved_answer_needs_approval_again():
    """The approval covered the text it was given: once edited, neither text is served until the
    new one is approved (its Redis entry is evicted, and the serve path refuses a stale one)."""
    record = remember(policy(review_required=True), FIRST)
    alice = reviewer("alice")
    approve(alice, record, open_page(alice, record))
    stale = in_redis()
    assert stale["text"] == FIRST

    page = edit(alice, record, "Corrected.", open_page(alice, record))
    assert b"approve it on this page" in page.content
    record.refresh_from_db()
    assert record.status == "pending" and in_redis() is None
    assert not review.entry_servable(key=KEY, entry=stale)


@pytest.mark.unit
@real_db
def test_approve_refuses_posts_that_do_not_say_what_was_read():
    """No digest (a script, an old list page), or unsaved text typed on the page: not approved.
    The list offers no approve at all, neither per row nor as a bulk action."""
    record = remember(policy(review_required=True), FIRST)
    alice = reviewer("alice")
    said = approve(alice, record, "")
    assert any("approve on the answer's own page" in line for line in said), said
    said = approve(alice, record, open_page(alice, record), answer="Typed, not saved.")
    assert any("Save it first" in line for line in said), said
    record.refresh_from_db()
    assert record.status == "pending" and in_redis() is None

    listing = alice.get("/admin/chat/cachedanswer/").content.decode()
    assert 'value="approve"' not in listing and "review-approve" not in listing
    assert "review-read" in listing and 'value="reject"' in listing
    alice.post("/admin/chat/cachedanswer/", {"action": "approve", "_selected_action": [record.pk]})
    record.refresh_from_db()
    assert record.status == "pending"


@pytest.mark.unit
@real_db
def test_an_approval_holds_the_row_so_a_generation_cannot_slip_between_check_and_approve():
    """A generation refilling an evicted record while its approval is between the digest check
    and the write cannot write: on PostgreSQL it waits for the row lock, then finds the record
    approved and leaves its text alone; on the tests' in-memory SQLite (shared cache) the
    approval's write transaction makes it fail at once with "locked" (a file database waits).
    Either way the approved text is the one the reviewer read."""
    record = remember(policy(review_required=True), FIRST)
    answer_policy = record.policy
    review.answer_evict(record_id=record.pk)
    read = review.record_digest(record)
    checked, go = threading.Event(), threading.Event()
    original = review.record_digest

    def slow_digest(row):
        checked.set()
        assert go.wait(10)
        return original(row)

    approved: list = []
    refused: list[Exception] = []

    def in_thread(work):
        def run():
            try:
                work()
            except OperationalError as exc:
                refused.append(exc)
            finally:
                connection.close()

        return threading.Thread(target=run)

    approver = in_thread(
        lambda: approved.append(
            review.answer_approve(record_id=record.pk, seen_digest=read, by=None)
        )
    )
    generator = in_thread(lambda: remember(answer_policy, SECOND))
    review.record_digest = slow_digest
    try:
        approver.start()
        assert checked.wait(10)
        generator.start()
        generator.join(0.5)
        assert generator.is_alive() or "locked" in str(refused), (
            "the generation wrote while the approval held the row"
        )
    finally:
        go.set()
        review.record_digest = original
    approver.join(10)
    generator.join(10)
    assert approved == [review.Approval.PUBLISHED]
    record.refresh_from_db()
    assert (record.status, record.answer) == ("approved", FIRST)
    assert in_redis()["text"] == FIRST


# -- rejecting and evicting are durable ----------------------------------------------------


@pytest.mark.unit
@real_db
@pytest.mark.parametrize("action", ["reject", "evict"])
def test_a_withdrawal_redis_missed_is_retried_and_never_served_meanwhile(
    action, settings, monkeypatch
):
    """Redis unreachable when the reviewer rejects (or evicts): the status changes at once and a
    PendingEviction remembers the delete. The entry Redis still holds is refused by the serve
    path; once Redis answers, the retry removes it."""
    record = remember(policy(review_required=False), FIRST)
    entry = raw_entry()
    assert entry["text"] == FIRST and review.entry_servable(key=KEY, entry=entry)
    alice = reviewer("alice")

    redis_down(settings, monkeypatch)
    response = alice.post(
        "/admin/chat/cachedanswer/",
        {"action": action, "_selected_action": [record.pk]},
        follow=True,
    )
    said = [str(message) for message in response.context["messages"]]
    assert any("stay in Redis until it answers again" in line for line in said), said
    record.refresh_from_db()
    assert record.status == {"reject": "rejected", "evict": "evicted"}[action]
    assert PendingEviction.objects.get(key=KEY).attempts >= 1
    assert raw_entry() == entry  # the delete never reached Redis
    assert not review.entry_servable(key=KEY, entry=raw_entry())  # ... and is not served

    settings.CHAT_CACHE_REDIS_URL = TEST_CACHE_URL  # Redis answers again
    assert evictions.evictions_retry() == 0
    assert raw_entry() is None and not PendingEviction.objects.exists()


@pytest.mark.unit
@real_db
def test_a_reset_rejected_answer_comes_back_only_as_a_new_answer():
    """Reset lets the key be cached again, but the rejected text never returns: the next
    generation refills the record, pending."""
    record = remember(policy(review_required=False), FIRST)
    review.answer_reject(record_id=record.pk, by=None)
    assert remember(record.policy, SECOND) is None  # rejected: not cached
    assert review.answer_reset(record_id=record.pk)
    record.refresh_from_db()
    assert record.status == "evicted" and in_redis() is None
    remember(record.policy, SECOND)
    record.refresh_from_db()
    assert (record.status, record.answer) == ("pending", SECOND)
    assert in_redis()["text"] == SECOND


# -- the serve path ---------------------------------------------------------------------


@pytest.mark.unit
@real_db
def test_only_an_approved_record_or_a_pending_one_without_review_is_served(
    django_assert_num_queries,
):
    """The record's status decides, whatever Redis holds, in one query on a hit; an entry whose
    text is not the record's (written before an edit or a refill) is never served."""
    open_record = remember(policy(review_required=False), FIRST, key="o" * 64)
    entry = review.cache_entry(open_record)
    with django_assert_num_queries(1):
        assert review.entry_servable(key=open_record.key, entry=entry)
    assert not review.entry_servable(key=open_record.key, entry={**entry, "text": "stale"})

    reviewed = remember(policy(review_required=True), FIRST, key="r" * 64)
    entry = review.cache_entry(reviewed)
    cases = {"pending": False, "approved": True, "rejected": False, "evicted": False}
    for status, served in cases.items():
        CachedAnswer.objects.filter(pk=reviewed.pk).update(status=status)
        assert review.entry_servable(key=reviewed.key, entry=entry) is served, status
    CachedAnswer.objects.filter(pk=open_record.pk).update(status="rejected")
    assert not review.entry_servable(key=open_record.key, entry=review.cache_entry(open_record))


@pytest.mark.unit
@real_db
def test_a_cached_answer_whose_policy_was_deleted_is_served_only_once_approved():
    """No policy left to say the answer needs no review: pending, it is not served (its entry
    leaves Redis), an edit of it waits for approval, and an approval serves it again."""
    open_policy = policy(review_required=False)
    record = remember(open_policy, FIRST)
    entry = review.cache_entry(record)
    assert review.entry_servable(key=KEY, entry=entry) and in_redis() is not None
    open_policy.delete()
    record.refresh_from_db()
    assert record.policy is None and record.status == CachedAnswer.Status.PENDING

    assert not review.entry_servable(key=KEY, entry=entry)
    assert in_redis() is None  # a hit on it is a miss, and its entry goes
    staff = User.objects.create_user("editor")
    edited = review.answer_edit(
        record_id=record.pk, text=SECOND, seen_digest=review.record_digest(record), by=staff
    )
    record.refresh_from_db()
    assert edited is review.Edit.AWAITS_APPROVAL and in_redis() is None
    assert not review.entry_servable(key=KEY, entry=review.cache_entry(record))

    approval = review.answer_approve(
        record_id=record.pk, seen_digest=review.record_digest(record), by=staff
    )
    assert approval is review.Approval.PUBLISHED and in_redis()["text"] == SECOND
    assert review.entry_servable(key=KEY, entry=review.cache_entry(record))


# -- the real model over the socket --------------------------------------------------------


@pytest.mark.integration
@real_db
async def test_a_rejected_answer_is_not_served_while_redis_still_holds_it(
    make_client, example_policies, settings, monkeypatch
):
    """End to end on the real model: an answer cached over the socket, rejected in the admin
    while Redis is unreachable, Redis back with the entry still in it: the same prompt is
    generated anew, never served the rejected text."""
    first = await ask(await make_client())
    assert not first[-1]["cached"]
    record = await settled(lambda: CachedAnswer.objects.first())
    assert (await ask(await make_client()))[-1]["cached"]  # servable: served from Redis
    entry = raw_entry(record.key)
    assert entry["text"] == record.answer == first[-1]["text"]

    staff = await admin_client(review=True)
    redis_down(settings, monkeypatch)
    await run_action(staff, "reject", record.pk)
    assert await sync_to_async(PendingEviction.objects.filter(key=record.key).exists)()
    settings.CHAT_CACHE_REDIS_URL = TEST_CACHE_URL
    assert raw_entry(record.key) == entry  # the rejected answer is still in Redis

    again = await ask(await make_client())
    assert not again[-1]["cached"] and again[-1]["metrics"]["new_tokens"] > 0
    # The turn records its answer after `done`: the rejected record links its conversation.
    await settled(lambda: record.sources.count() == 3 or None)
    assert raw_entry(record.key) is None  # the serve path removed it; nothing republished
    kept = await sync_to_async(CachedAnswer.objects.get)(pk=record.pk)
    assert (kept.status, kept.answer) == ("rejected", record.answer)


async def settled(probe):
    """`probe()`'s first truthy answer, polled while a turn finishes after its `done`."""
    for _ in range(250):
        found = await sync_to_async(probe)()
        if found:
            return found
        await asyncio.sleep(0.02)
    raise AssertionError("the turn never settled")
