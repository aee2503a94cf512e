"""The completion cache against real Redis: keys, hits, what is never cached, review, outages."""

import asyncio
import re
import shutil
import subprocess
import time

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Permission, User
from django.test import AsyncClient

from chat.models import CachedAnswer, Message
from chat.stores.cache import completion_cache
from harness.liveserver import free_port
from harness.scripted import Answer

PROMPT = "Count from 1 to 10, separated by commas."

ws_db = pytest.mark.django_db(transaction=True)


def kinds(events):
    return [e["type"] for e in events]


async def ask(client, text=PROMPT, **extra):
    request_id = await client.prompt(text, **extra)
    return await client.receive_until("done", request_id)


def count_submits(runtime, monkeypatch) -> list:
    calls = []
    original = runtime.scheduler.submit
    monkeypatch.setattr(
        runtime.scheduler, "submit", lambda *a, **k: (calls.append(1), original(*a, **k))[1]
    )
    return calls


@pytest.mark.integration
@ws_db
async def test_a_repeated_prompt_is_served_from_the_cache_without_generation(
    client, make_client, runtime, example_policies, monkeypatch
):
    """The second identical prompt gets one `done` (cached), no chunk, no scheduler call; both are stored."""
    first = await ask(client)
    assert "chunk" in kinds(first) and first[-1]["cached"] is False
    submits = count_submits(runtime, monkeypatch)
    other = await make_client()  # another visitor, same prompt, new conversation: same model input
    second = await ask(other)
    assert kinds(second) == ["accepted", "done"] and submits == []
    done = second[-1]
    assert (
        done["cached"] is True
        and done["text"] == first[-1]["text"]
        and done["finish_reason"] == first[-1]["finish_reason"]
    )
    assert done["metrics"]["new_tokens"] == 0 and done["metrics"]["total_ms"] < 1000
    message = await sync_to_async(Message.objects.get)(pk=done["message"])
    assert (
        message.text == done["text"]
        and message.metrics["cached_new_tokens"] == first[-1]["metrics"]["new_tokens"]
    )
    record = await sync_to_async(CachedAnswer.objects.get)()
    assert (record.hits, record.status, record.policy_slug) == (1, "pending", "chat")
    assert record.first_served_at is not None and record.prompt == PROMPT


@pytest.mark.integration
@ws_db
async def test_cancelled_length_and_invalid_answers_are_never_cached(
    client, runtime, make_policy, monkeypatch
):
    await sync_to_async(make_policy)(slug="short", max_new_tokens=3)
    await sync_to_async(make_policy)(
        slug="strict",
        mode="buffer",
        max_retries=0,
        max_new_tokens=20,
        json_schema={"type": "array", "minItems": 50},
    )
    long_id = await client.prompt("Write a long story about a dragon.")
    await client.receive_until("chunk", long_id)
    await client.send({"type": "cancel", "request_id": long_id})
    assert (await client.receive_until("done", long_id))[-1]["finish_reason"] == "cancelled"
    assert (await ask(client, policy="short"))[-1]["finish_reason"] == "length"
    assert (await ask(client, policy="strict"))[-1]["finish_reason"] == "invalid"
    submits = count_submits(runtime, monkeypatch)
    again = [
        await ask(client, "Write a long story about a dragon.", policy="short"),
        await ask(client, policy="short"),
        await ask(client, policy="strict"),
    ]
    assert len(submits) == 3 and all(not events[-1]["cached"] for events in again)
    assert await sync_to_async(CachedAnswer.objects.count)() == 0


async def admin_client(*, review: bool) -> AsyncClient:
    def make():
        user = User.objects.create_user(f"admin{time.monotonic_ns()}", password="pw", is_staff=True)
        user.user_permissions.add(Permission.objects.get(codename="view_cachedanswer"))
        if review:
            user.user_permissions.add(Permission.objects.get(codename="review_cachedanswer"))
        return user

    client = AsyncClient()
    await client.aforce_login(await sync_to_async(make)())
    return client


async def run_action(admin, action: str, record_id: int):
    return await admin.post(
        "/admin/chat/cachedanswer/", {"action": action, "_selected_action": [record_id]}
    )


SEEN_DIGEST = re.compile(r'name="seen_digest" value="([0-9a-f]{64})"')


def seen_digest(page: str) -> str:
    """The digest of the text an answer's admin page showed (its hidden `seen_digest`)."""
    found = SEEN_DIGEST.search(page)
    assert found, "the change page carries no seen_digest"
    return found.group(1)


async def page_digest(admin, record_id: int) -> str:
    """Open the answer's admin page, as a reviewer reading it does."""
    page = await admin.get(f"/admin/chat/cachedanswer/{record_id}/change/")
    assert page.status_code == 200
    return seen_digest(page.content.decode())


async def approve_on_page(admin, record_id: int, digest: str | None = None):
    """Press Approve on the answer's page (opened now, unless `digest` says what it showed)."""
    digest = digest or await page_digest(admin, record_id)
    return await admin.post(
        f"/admin/chat/cachedanswer/{record_id}/approve/", {"seen_digest": digest}
    )


async def edit_on_page(admin, record_id: int, text: str):
    digest = await page_digest(admin, record_id)
    return await admin.post(
        f"/admin/chat/cachedanswer/{record_id}/change/", {"answer": text, "seen_digest": digest}
    )


@pytest.mark.integration
@ws_db
async def test_admin_review_decides_what_is_served(
    make_client, runtime, make_policy, scripted, monkeypatch
):
    """Approval gates serving; reject evicts and stops re-caching until reset; an edit is what is
    served once approved, and reset lets a new answer in, never the rejected one.

    Cache logic only, so the answers are scripted (the real model's path is tested above): each
    generation says something else, so a served text is the stored one, not a new generation."""
    await sync_to_async(make_policy)(slug="reviewed", require_review=True, max_new_tokens=40)
    scripted(*(Answer((f"Answer {n}.",)) for n in range(1, 8)))
    asker = await make_client()
    await ask(asker, policy="reviewed")
    record = await sync_to_async(CachedAnswer.objects.get)()
    assert (record.status, record.answer) == ("pending", "Answer 1.")
    assert not (await ask(asker, policy="reviewed"))[-1]["cached"]  # pending answers are not served
    # Asked again while pending, it was generated again; the record keeps the first answer.
    assert (await sync_to_async(CachedAnswer.objects.get)(pk=record.pk)).answer == "Answer 1."

    reviewer = await admin_client(review=True)
    assert (await approve_on_page(reviewer, record.pk)).status_code == 302
    served = await ask(await make_client(), policy="reviewed")
    assert served[-1]["cached"] and served[-1]["text"] == "Answer 1."  # what the reviewer read

    change = await edit_on_page(reviewer, record.pk, "Edited by a reviewer.")
    assert change.status_code == 302
    edited = await sync_to_async(CachedAnswer.objects.get)(pk=record.pk)
    assert (edited.status, edited.edited_at is not None) == ("pending", True)
    # An edit needs its own approval: neither the old nor the new text is served meanwhile.
    assert not (await ask(await make_client(), policy="reviewed"))[-1]["cached"]
    await approve_on_page(reviewer, record.pk)
    assert (await ask(await make_client(), policy="reviewed"))[-1][
        "text"
    ] == "Edited by a reviewer."

    await run_action(reviewer, "reject", record.pk)
    submits = count_submits(runtime, monkeypatch)
    for _ in range(2):  # rejected: neither served nor cached again, however often it is asked
        assert not (await ask(await make_client(), policy="reviewed"))[-1]["cached"]
    assert len(submits) == 2
    assert (await sync_to_async(CachedAnswer.objects.get)(pk=record.pk)).status == "rejected"

    await run_action(reviewer, "reset", record.pk)
    await ask(await make_client(), policy="reviewed")
    refilled = await sync_to_async(CachedAnswer.objects.get)(pk=record.pk)
    assert (refilled.status, refilled.answer) == ("pending", "Answer 6.")  # a new answer, afresh
    assert refilled.edited_at is None and refilled.reviewed_by is None


@pytest.mark.integration
@ws_db
async def test_evict_removes_an_answer_from_the_cache(make_client, example_policies, scripted):
    """Evicted, the answer is not served; the next generation refills the record, which is served."""
    scripted(Answer(("Answer 1.",)), Answer(("Answer 2.",)))  # cache logic: scripted answers
    await ask(await make_client())
    record = await sync_to_async(CachedAnswer.objects.get)()
    assert (await ask(await make_client()))[-1]["cached"]
    reviewer = await admin_client(review=True)
    await run_action(reviewer, "evict", record.pk)
    assert not (await ask(await make_client()))[-1]["cached"]
    refilled = await ask(await make_client())
    assert refilled[-1]["cached"] and refilled[-1]["text"] == "Answer 2."


@pytest.mark.integration
@ws_db
async def test_a_repeat_sent_the_moment_done_arrives_is_answered_before_the_first_is_cached(
    client, example_policies, scripted, monkeypatch
):
    """The answer is cached just after its `done`. A repeat sent on the same socket the moment
    that `done` arrives (the first turn still caching, held here until the repeat is answered)
    is answered, never refused as `busy`; once cached, the next repeat is served from the cache."""
    from chat.turns.finish import TurnFinish

    scripted(Answer(("Answer 1.",)), Answer(("Answer 2.",)))
    release, remembered = asyncio.Event(), []
    remember = TurnFinish._remember

    async def remember_once_released(self, *args, **kwargs):
        await release.wait()
        await remember(self, *args, **kwargs)
        remembered.append(self)

    monkeypatch.setattr(TurnFinish, "_remember", remember_once_released)
    first = (await ask(client))[-1]
    repeat_id = await client.prompt(PROMPT)
    while (event := await client.receive(timeout=30))["type"] not in ("done", "error"):
        pass
    assert event["type"] == "done" and event["request_id"] == repeat_id, event
    assert event["text"] == "Answer 2." and event["cached"] is False
    release.set()
    deadline = time.monotonic() + 10
    while len(remembered) < 2:
        assert time.monotonic() < deadline, "the answers were never cached"
        await asyncio.sleep(0.05)
    served = (await ask(client))[-1]
    assert served["cached"] is True and served["text"] in (first["text"], "Answer 2.")


@pytest.mark.integration
@ws_db
async def test_reviewing_cached_answers_needs_its_own_permission(example_policies, make_client):
    await ask(await make_client())
    record = await sync_to_async(CachedAnswer.objects.get)()
    viewer = await admin_client(review=False)
    assert (await viewer.get("/admin/chat/cachedanswer/")).status_code == 200
    await run_action(viewer, "reject", record.pk)
    assert (await sync_to_async(CachedAnswer.objects.get)(pk=record.pk)).status == "pending"
    edit = await viewer.post(f"/admin/chat/cachedanswer/{record.pk}/change/", {"answer": "hacked"})
    assert edit.status_code == 403
    assert (await ask(await make_client()))[-1]["text"] != "hacked"


class RedisServer:
    """A redis-server of the test's own on a free loopback port, to stop and start at will.

    With a `directory` it keeps its data across a stop and a start (saved on shutdown), so an
    entry left behind by an outage is still there when it comes back.
    """

    def __init__(self, directory=None):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.directory = None if directory is None else str(directory)
        self.process = None

    def start(self):
        command = [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no"]
        if self.directory is not None:
            command += ["--dir", self.directory, "--dbfilename", "dump.rdb"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        import redis

        for _ in range(100):
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        if self.directory is not None:
            import redis

            redis.Redis.from_url(self.url).shutdown(save=True)
        else:
            self.process.terminate()
        self.process.wait(10)


@pytest.mark.integration
@ws_db
async def test_chat_goes_on_uncached_while_redis_is_down_and_caching_resumes(
    client, settings, example_policies, monkeypatch
):
    """Redis stopped mid-run: answers keep coming (uncached, no error); restarted: caching resumes by itself."""
    server = RedisServer()
    server.start()
    settings.CHAT_CACHE_REDIS_URL = server.url
    monkeypatch.setattr(completion_cache, "backoff_seconds", 0.2)
    try:
        await ask(client)
        assert (await ask(client, conversation=None))[-1]["cached"]
        server.stop()
        down = await ask(client, "Count from 1 to 5, separated by commas.")
        assert kinds(down)[-1] == "done" and "chunk" in kinds(down) and not down[-1]["cached"]
        assert "error" not in kinds(down)
        health = await AsyncClient().get("/healthz")
        assert health.status_code == 200 and health.json()["cache"].startswith("unavailable")
        server.start()
        await asyncio.sleep(0.3)  # past the back-off
        await ask(client, "Count from 1 to 6, separated by commas.")
        assert (await ask(client, "Count from 1 to 6, separated by commas."))[-1]["cached"]
        assert completion_cache.status() == "ok"
    finally:
        server.stop()
