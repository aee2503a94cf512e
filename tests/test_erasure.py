"""Deleting means deleted: a conversation, an account or retention reaches the completion cache
(Redis) and the review list. Real Redis, the test database (SQLite or PostgreSQL), the socket
through Channels' communicator and the views through Django's test client.

Answers are scripted (harness/scripted.py) where what matters is what the turn does around them;
the deletion while an answer streams runs on the real model (a few tokens before the cancel).
"""

from __future__ import annotations

import asyncio
import importlib
import io
import logging
import threading
import time
from datetime import timedelta

import pytest
import redis
from asgiref.sync import sync_to_async
from django.apps import apps
from django.contrib.auth.models import Permission, User
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.core.management import CommandError, call_command
from django.test import AsyncClient
from django.utils import timezone

from chat import turns
from chat.engine.sampling_params import SamplingChanges
from chat.engine.stack import StackConfig, build_stack
from chat.engine.types import GenerationResult
from chat.models import (
    ApiKey,
    CachedAnswer,
    CachedAnswerSource,
    Conversation,
    Message,
    PendingEviction,
)
from chat.protocol import CONVERSATION_DELETED
from chat.stores import erasure
from chat.stores.apikeys import apikey_authenticate, apikey_create
from chat.stores.cache import KEY_PREFIX, completion_cache
from chat.stores.policy_store import PolicyOverride
from chat.turns.prepare import settings_text
from harness.liveserver import free_port
from harness.scripted import Answer, ScriptedBackend
from tests.conftest import LIVE_CACHE_URL, TEST_CACHE_URL, ChatClient
from tests.test_cache import RedisServer

ws_db = pytest.mark.django_db(transaction=True)

PASSPORT = "P-48151623"
SECRET = f"Remember this: my passport number is {PASSPORT}. Say OK."
PASSWORD = "a-long-pass-phrase-42"


# -- helpers ---------------------------------------------------------------------------


def cached_keys(url: str = TEST_CACHE_URL) -> set[str]:
    client = redis.Redis.from_url(url)
    try:
        return {k.decode().removeprefix(KEY_PREFIX) for k in client.keys(KEY_PREFIX + "*")}
    finally:
        client.close()


def redis_holding(*texts: str) -> list[str]:
    """The keys of the tests' Redis databases whose value holds any of `texts`, whatever its type."""
    read = {
        b"string": lambda c, k: c.get(k),
        b"hash": lambda c, k: c.hgetall(k),
        b"list": lambda c, k: c.lrange(k, 0, -1),
        b"set": lambda c, k: c.smembers(k),
        b"zset": lambda c, k: c.zrange(k, 0, -1),
        b"stream": lambda c, k: c.xrange(k),
    }
    holding = []
    for url in (TEST_CACHE_URL, LIVE_CACHE_URL):
        client = redis.Redis.from_url(url)
        try:
            for key in client.scan_iter():
                value = repr(read[client.type(key)](client, key)).encode().decode("unicode_escape")
                if any(text in value for text in texts):
                    holding.append(key.decode())
        finally:
            client.close()
    return holding


def count(model, **filters) -> int:
    return model.objects.filter(**filters).count()


acount = sync_to_async(count)


async def visitor() -> AsyncClient:
    http = AsyncClient()
    await http.get("/")  # the session the visitor's socket shares
    return http


async def signed_in(username: str) -> tuple[AsyncClient, User]:
    user = await sync_to_async(User.objects.create_user)(username, password=PASSWORD)
    http = AsyncClient()
    await http.aforce_login(user)
    return http, user


async def socket_of(http: AsyncClient) -> ChatClient:
    from project.asgi import application

    return await ChatClient(application, session_key=http.cookies["sessionid"].value).connect()


async def ask(http: AsyncClient, text: str = SECRET) -> dict:
    """One prompt over the caller's socket in a new conversation; its `done`, once the turn has
    settled (an answer is cached, and a hit counted, after `done` went out)."""
    chat = await socket_of(http)
    try:
        request_id = await chat.prompt(text)
        done = (await chat.receive_until("done", request_id, timeout=30))[-1]
    finally:
        await chat.close()
    for _ in range(500):
        stored = await acount(Message, pk=done["message"], status=Message.Status.STREAMING) == 0
        if stored and turns.running_turns.get(done["message"]) is None:
            return done
        await asyncio.sleep(0.02)
    raise AssertionError(f"the turn of message {done['message']} never settled")


async def conversation_of(done: dict) -> int:
    message = await sync_to_async(Message.objects.get)(pk=done["message"])
    return message.conversation_id


async def delete(http: AsyncClient, conversation_id: int) -> int:
    return (await http.delete(f"/api/conversations/{conversation_id}/")).status_code


async def reviewer() -> AsyncClient:
    def make():
        user = User.objects.create_user(f"staff{time.monotonic_ns()}", password="pw", is_staff=True)
        for codename in ("view_cachedanswer", "review_cachedanswer", "delete_cachedanswer"):
            user.user_permissions.add(Permission.objects.get(codename=codename))
        return user

    http = AsyncClient()
    await http.aforce_login(await sync_to_async(make)())
    return http


async def review_list(staff: AsyncClient) -> str:
    response = await staff.get("/admin/chat/cachedanswer/")
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture
def scripted_ready(runtime, scripted, example_policies):
    """The scripted backend, installed once the real model has loaded (so its loader never
    replaces the script mid-test), with the `chat` policy (cached, no review) as default."""
    return scripted


# -- a conversation ---------------------------------------------------------------------


@pytest.mark.integration
@ws_db
async def test_deleting_a_conversation_erases_its_cached_answer_from_redis_and_the_review_list(
    scripted_ready,
):
    """The issue's path: personal data in a prompt, answered and cached, then the conversation
    deleted. The record, its Redis key and every trace in the admin's list go."""
    scripted_ready(Answer(("OK.",)))
    http = await visitor()
    done = await ask(http)
    assert done["finish_reason"] in ("eos", "length") and not done["cached"]
    record = await sync_to_async(CachedAnswer.objects.get)()
    staff = await reviewer()
    assert record.key in cached_keys() and PASSPORT in await review_list(staff)

    assert await delete(http, await conversation_of(done)) == 204
    assert await acount(CachedAnswer) == 0 and await acount(CachedAnswerSource) == 0
    assert cached_keys() == set() and await acount(PendingEviction) == 0
    assert PASSPORT not in await review_list(staff)
    assert await acount(Message, text__contains=PASSPORT) == 0


@pytest.mark.integration
@ws_db
async def test_an_answer_another_conversation_holds_stays_until_that_one_is_deleted_too(
    scripted_ready,
):
    """Served from the cache to a second visitor, the answer is theirs too: deleting the first
    conversation keeps it (and it is still served); deleting the second erases it."""
    backend = scripted_ready(Answer(("OK.",)), Answer(("OK again.",)))
    first, second = await visitor(), await visitor()
    first_done = await ask(first)
    second_done = await ask(second)
    assert second_done["cached"] and len(backend.requests) == 1
    record = await sync_to_async(CachedAnswer.objects.get)()
    assert await acount(CachedAnswerSource, cached_answer=record) == 2

    assert await delete(first, await conversation_of(first_done)) == 204
    kept = await sync_to_async(CachedAnswer.objects.get)(pk=record.pk)
    assert kept.prompt == SECRET and record.key in cached_keys()
    assert (await ask(await visitor()))["cached"]  # still served; a third holder now

    for conversation in await sync_to_async(list)(Conversation.objects.all()):
        await sync_to_async(erasure.conversations_erase)(
            conversations=Conversation.objects.filter(pk=conversation.pk)
        )
    assert await acount(CachedAnswer) == 0 and cached_keys() == set()


@pytest.mark.integration
@ws_db
async def test_an_approved_answer_is_kept_and_served_with_its_prompt_redacted(scripted_ready):
    """The choice for shared answers: approval vouches for the answer, the prompt is the person's."""
    from chat.stores import review

    scripted_ready(Answer(("OK.",)), Answer(("OK.",)))
    http = await visitor()
    done = await ask(http)
    record = await sync_to_async(CachedAnswer.objects.get)()
    approved = await sync_to_async(review.answer_approve)(
        record_id=record.pk, seen_digest=review.record_digest(record), by=None
    )
    assert approved is review.Approval.PUBLISHED

    assert await delete(http, await conversation_of(done)) == 204
    kept = await sync_to_async(CachedAnswer.objects.get)(pk=record.pk)
    assert (kept.status, kept.answer) == ("approved", "OK.")
    assert PASSPORT not in kept.prompt + kept.rendered_prompt
    assert kept.prompt == erasure.REDACTED and kept.redacted_at is not None
    assert PASSPORT not in await review_list(await reviewer())
    assert record.key in cached_keys()

    again = await ask(await visitor())  # whoever sends the same input gets the shared answer
    assert again["cached"] and again["text"] == "OK."
    assert (await sync_to_async(CachedAnswer.objects.get)(pk=record.pk)).prompt == erasure.REDACTED
    assert await acount(CachedAnswerSource, cached_answer=record, conversation__isnull=False) == 1

    completion_cache.evict(record.key)  # its TTL ran out: the next asker's answer is recorded
    await ask(await visitor())
    holder = await sync_to_async(CachedAnswer.objects.get)(pk=record.pk)
    assert (holder.prompt, holder.redacted_at, holder.status) == (SECRET, None, "approved")


@pytest.mark.integration
@ws_db
async def test_deleting_a_conversation_while_its_answer_streams_cancels_it_and_caches_nothing(
    application, runtime, example_policies
):
    """The real model: the answer is cancelled within a step (done says why), its conversation
    and messages are gone, and nothing of it reaches the cache or the review list."""
    http = await visitor()
    chat = await socket_of(http)
    request_id = await chat.prompt("Write a very long story about a dragon who learns to bake.")
    accepted = await chat.receive()
    assert accepted["type"] == "accepted"
    await chat.receive_until("chunk", request_id)
    assert await delete(http, accepted["conversation"]) == 204
    done = (await chat.receive_until("done", request_id, timeout=30))[-1]
    assert (done["finish_reason"], done["reason"]) == ("cancelled", CONVERSATION_DELETED)
    await asyncio.sleep(0.5)  # anything the turn still writes after its `done`
    assert await acount(Conversation, pk=accepted["conversation"]) == 0
    assert await acount(Message, pk=accepted["message"]) == 0
    assert await acount(CachedAnswer) == 0 and cached_keys() == set()
    await chat.close()


class GatedBackend(ScriptedBackend):
    """Streams a first chunk, then holds its answer until `gate` opens, then ends on eos: an
    answer still generating somewhere the deletion's cancel cannot reach."""

    def __init__(self, gate: threading.Event):
        super().__init__([])
        self.gate = gate

    def generate(self, request, on_text):
        started = time.perf_counter()
        on_text("OK")
        self.gate.wait(30)
        on_text(".")
        return GenerationResult(
            text="OK.",
            finish_reason="eos",
            new_tokens=2,
            prompt_tokens=len(request.input_ids),
            started_at=started,
            first_token_at=started,
            finished_at=time.perf_counter(),
        )


@pytest.fixture
def cancel_lost(runtime, monkeypatch):
    """The runtime's engine replaced by one that holds each answer until the gate it yields is
    set, and a deletion's cancel lost (another process, the bus down)."""
    from chat.infra.runtime import runtime as chat_runtime

    gate = threading.Event()
    backend = GatedBackend(gate)
    stack = build_stack(backend, StackConfig(max_running=2))
    monkeypatch.setattr(chat_runtime, "backend", backend)
    monkeypatch.setattr(chat_runtime, "stack", stack)
    monkeypatch.setattr(erasure, "_answers_stop", lambda running: None)
    yield gate
    gate.set()
    stack.close()


@pytest.mark.integration
@ws_db
async def test_an_answer_that_ends_normally_after_its_conversation_was_deleted_is_not_cached(
    cancel_lost, example_policies, caplog
):
    """Where the cancel cannot reach the turn (another process, the channel layer down), the
    answer ends normally after the deletion: it is still never recorded or cached."""
    import project.asgi  # noqa: F401  its django.setup() configures logging: before the handler

    chat_logger = logging.getLogger("chat")  # it does not propagate to caplog's root handler
    chat_logger.addHandler(caplog.handler)
    gate = cancel_lost
    try:
        http = await visitor()
        chat = await socket_of(http)
        request_id = await chat.prompt(SECRET)
        accepted = await chat.receive()
        await chat.receive_until("chunk", request_id)
        assert await delete(http, accepted["conversation"]) == 204
        gate.set()
        done = (await chat.receive_until("done", request_id))[-1]
        assert done["finish_reason"] in ("eos", "length")
        await asyncio.sleep(0.5)  # the answer is recorded for the cache after its `done`
        assert await acount(CachedAnswer) == 0 and cached_keys() == set()
        assert not [r for r in caplog.records if r.levelname == "ERROR"]  # refused, not failed
        await chat.close()
    finally:
        chat_logger.removeHandler(caplog.handler)


ANSWER_SECRET = "the code is K-2718281"


@pytest.mark.integration
@ws_db
async def test_a_deleted_conversation_leaves_no_text_of_its_prompt_or_answer_in_redis(
    scripted_ready,
):
    """The answer's event stream (kept for a page coming back) goes with the conversation, at
    once: no key of Redis holds the prompt or the answer after the deletion."""
    scripted_ready(Answer(("Noted: ", ANSWER_SECRET, ".")))
    http = await visitor()
    done = await ask(http)
    assert ANSWER_SECRET in done["text"] and redis_holding(ANSWER_SECRET)
    assert await delete(http, await conversation_of(done)) == 204
    assert redis_holding(PASSPORT, ANSWER_SECRET) == []


@pytest.mark.integration
@ws_db
async def test_a_deleted_account_leaves_no_text_of_its_prompts_or_answers_in_redis(
    scripted_ready,
):
    scripted_ready(Answer(("Noted: ", ANSWER_SECRET, ".")))
    http, user = await signed_in("erin")
    done = await ask(http)
    assert ANSWER_SECRET in done["text"] and redis_holding(ANSWER_SECRET)
    response = await http.post("/account/delete/", {"password": PASSWORD})
    assert response.status_code == 302 and await acount(User, pk=user.pk) == 0
    assert redis_holding(PASSPORT, ANSWER_SECRET) == []


@pytest.mark.integration
@ws_db
async def test_an_answer_ending_after_its_conversation_was_deleted_writes_no_events_again(
    cancel_lost, example_policies
):
    """The cancel lost (another process, the bus down): the turn's last events come after the
    deletion erased its stream, and are not written."""
    gate = cancel_lost
    http = await visitor()
    chat = await socket_of(http)
    request_id = await chat.prompt(SECRET)
    accepted = await chat.receive()
    await chat.receive_until("chunk", request_id)
    await asyncio.sleep(0.3)  # its first events are in Redis
    stream = f"chat:answer-events:{accepted['message']}"
    assert redis.Redis.from_url(TEST_CACHE_URL).exists(stream)
    assert await delete(http, accepted["conversation"]) == 204
    gate.set()
    done = (await chat.receive_until("done", request_id))[-1]
    assert done["text"] == "OK."
    await asyncio.sleep(0.5)  # whatever the turn writes after its `done`
    assert not redis.Redis.from_url(TEST_CACHE_URL).exists(stream)
    assert redis_holding(PASSPORT, "OK.") == []
    await chat.close()


# -- Redis down during a deletion -------------------------------------------------------


@pytest.mark.integration
@ws_db
async def test_a_redis_outage_during_deletion_leaves_a_pending_eviction_that_is_retried(
    scripted_ready, settings, monkeypatch, tmp_path
):
    """Redis down when the conversation is deleted: the row goes at once, the eviction is kept
    in the database, nothing erased is served once Redis is back, and the eviction is done by
    the next try (here `manage.py purge`, which exits 1 while it cannot)."""
    server = RedisServer(tmp_path)
    server.start()
    settings.CHAT_CACHE_REDIS_URL = server.url
    monkeypatch.setattr(completion_cache, "backoff_seconds", 0.1)
    backend = scripted_ready(Answer(("OK.",)), Answer(("A new answer.",)))
    try:
        http = await visitor()
        done = await ask(http)
        key = (await sync_to_async(CachedAnswer.objects.get)()).key
        assert key in cached_keys(server.url)

        server.stop()
        assert await delete(http, await conversation_of(done)) == 204
        assert await acount(CachedAnswer) == 0
        pending = await sync_to_async(PendingEviction.objects.get)()
        assert pending.key == key and pending.attempts >= 1
        await asyncio.sleep(0.15)  # past the back-off: the next try really asks Redis
        with pytest.raises(CommandError, match="1 cache eviction"):
            await sync_to_async(call_command)("purge", stdout=io.StringIO())
        assert (await sync_to_async(PendingEviction.objects.get)()).attempts >= 2

        server.start()
        assert key in cached_keys(server.url)  # the outage left it in Redis
        await asyncio.sleep(0.15)
        again = await ask(await visitor())  # the same input, from someone else
        assert not again["cached"] and len(backend.requests) == 2  # never the erased answer
        out = io.StringIO()
        await sync_to_async(call_command)("purge", stdout=out)
        assert "0 cache eviction(s) pending" in out.getvalue()
        assert await acount(PendingEviction) == 0
        fresh = await sync_to_async(CachedAnswer.objects.get)()  # the new holder's answer
        assert fresh.answer == "A new answer." and fresh.key == key
    finally:
        server.stop()


@pytest.mark.integration
@ws_db
async def test_evictions_retry_at_the_next_cache_write_once_redis_answers(
    scripted_ready, settings, monkeypatch
):
    """No purge needed: the next answer cached by any conversation clears what waited."""
    scripted_ready(Answer(("OK.",)), Answer(("Two.",)))
    monkeypatch.setattr(completion_cache, "backoff_seconds", 0.0)
    http = await visitor()
    done = await ask(http)
    key = (await sync_to_async(CachedAnswer.objects.get)()).key
    settings.CHAT_CACHE_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens
    assert await delete(http, await conversation_of(done)) == 204
    assert await acount(PendingEviction, key=key) == 1 and key in cached_keys()
    settings.CHAT_CACHE_REDIS_URL = TEST_CACHE_URL  # Redis answers again
    await ask(http, "Another question.")
    assert await acount(PendingEviction) == 0 and key not in cached_keys()


@pytest.mark.integration
@ws_db
async def test_deleting_a_record_in_the_admin_evicts_its_key(scripted_ready):
    scripted_ready(Answer(("OK.",)))
    await ask(await visitor())
    record = await sync_to_async(CachedAnswer.objects.get)()
    staff = await reviewer()
    response = await staff.post(
        "/admin/chat/cachedanswer/",
        {"action": "delete_selected", "_selected_action": [record.pk], "post": "yes"},
    )
    assert response.status_code == 302
    assert await acount(CachedAnswer) == 0 and cached_keys() == set()
    assert await acount(PendingEviction) == 0


@pytest.mark.integration
@ws_db
async def test_staff_deleting_a_conversation_in_the_admin_erases_its_cached_answer(scripted_ready):
    scripted_ready(Answer(("OK.",)), Answer(("OK.",)))
    kept = await conversation_of(await ask(await visitor(), "Keep this one."))
    gone = await conversation_of(await ask(await visitor()))
    staff = AsyncClient()
    await staff.aforce_login(
        await sync_to_async(User.objects.create_superuser)("root", password="pw")
    )
    response = await staff.post(
        "/admin/chat/conversation/",
        {"action": "delete_selected", "_selected_action": [gone], "post": "yes"},
    )
    assert response.status_code == 302
    assert await sync_to_async(list)(Conversation.objects.values_list("pk", flat=True)) == [kept]
    prompts = await sync_to_async(list)(CachedAnswer.objects.values_list("prompt", flat=True))
    assert prompts == ["Keep this one."] and len(cached_keys()) == 1
    assert PASSPORT not in await review_list(staff)


# -- an account -------------------------------------------------------------------------


async def account_with_everything(username: str) -> tuple[AsyncClient, User, dict]:
    """A signed-in user with two page conversations (one answer only theirs, one also served to
    a visitor), an API conversation and two keys, signed in from a second browser too."""
    http, user = await signed_in(username)
    own = await ask(http, SECRET)
    shared = await ask(http, "What is the capital of France?")
    other = await visitor()
    served = await ask(other, "What is the capital of France?")
    assert served["cached"]

    def api_things():
        key, secret = apikey_create(user=user, name="script")
        apikey_create(user=user, name="laptop")
        via_api = Conversation.objects.create(user=user, api_key=key, title="api")
        Message.objects.create(conversation=via_api, role="user", text=f"{PASSPORT} via API")
        own_settings = settings_text(
            PolicyOverride(system_prompt=f"You know {PASSPORT}."),
            SamplingChanges(stop_strings=(";",)),
        )
        Message.objects.create(
            conversation=via_api, role="assistant", text="Noted.", overrides=own_settings
        )
        return secret

    secret = await sync_to_async(api_things)()
    second_browser = AsyncClient()
    await second_browser.aforce_login(user)
    return (
        http,
        user,
        dict(own=own, shared=shared, other=other, secret=secret, second=second_browser),
    )


def sessions_of(user_id: int) -> int:
    store = SessionStore()
    return sum(
        store.decode(s.session_data).get("_auth_user_id") == str(user_id)
        for s in Session.objects.all()
    )


@pytest.mark.integration
@ws_db
async def test_a_user_deletes_their_account_with_their_password(scripted_ready):
    scripted_ready(Answer(("OK.",)), Answer(("Paris.",)))
    http, user, things = await account_with_everything("ada")
    page = (await http.get("/account/delete/")).content.decode()
    assert 'id="delete-conversations">3 conversations' in page and "2 API keys" in page
    assert await sync_to_async(sessions_of)(user.pk) == 2

    open_socket = await socket_of(http)  # a tab left open through the deletion
    wrong = await http.post("/account/delete/", {"password": "not it"})
    assert wrong.status_code == 400 and "That is not your password." in wrong.content.decode()
    assert await acount(User, pk=user.pk) == 1 and await acount(ApiKey, revoked_at=None) == 2

    done = await http.post("/account/delete/", {"password": PASSWORD})
    assert done.status_code == 302 and done["Location"] == "/account/deleted/"
    assert await acount(User, pk=user.pk) == 0
    assert await acount(Conversation, user_id=user.pk) == 0 and await acount(ApiKey) == 0
    assert await acount(Message, text__contains=PASSPORT) == 0
    assert await sync_to_async(sessions_of)(user.pk) == 0
    assert (await things["second"].get("/account/api-keys/")).status_code == 302  # signed out
    assert await sync_to_async(apikey_authenticate)(things["secret"]) is None
    # Only the answer nobody else holds is erased; the visitor's conversation keeps theirs.
    remaining = await sync_to_async(list)(CachedAnswer.objects.values_list("prompt", flat=True))
    assert remaining == ["What is the capital of France?"] and len(cached_keys()) == 1
    assert (await things["other"].get("/api/conversations/")).json()["conversations"]
    assert (await http.get("/account/deleted/")).status_code == 200
    await open_socket.prompt(SECRET)  # refused: the account's socket is ended, nothing stored
    assert (await open_socket.receive_until("error"))[-1]["code"] == "unauthorised"
    assert await acount(Conversation, user_id=user.pk) == 0
    await open_socket.close()


@pytest.mark.integration
@ws_db
async def test_an_accounts_keys_are_revoked_first_even_if_the_rest_fails(
    scripted_ready, monkeypatch
):
    http, user = await signed_in("grace")
    await sync_to_async(apikey_create)(user=user, name="script")

    def broken(**kwargs):
        raise RuntimeError("the database went away mid-deletion")

    monkeypatch.setattr(erasure, "conversations_erase", broken)
    with pytest.raises(RuntimeError):
        await http.post("/account/delete/", {"password": PASSWORD})
    assert await acount(User, pk=user.pk) == 1
    assert await acount(ApiKey, user=user, revoked_at=None) == 0


@pytest.mark.integration
@ws_db
async def test_the_password_check_is_throttled_like_a_sign_in(
    scripted_ready, settings, monkeypatch
):
    from chat.infra.ratelimit import signin_account_limiter

    settings.REDIS_URL = TEST_CACHE_URL
    monkeypatch.setattr(signin_account_limiter, "limit", 2)
    http, user = await signed_in("eve")
    for _ in range(3):  # one more than the limit: the last one is refused unchecked
        await http.post("/account/delete/", {"password": "guess"})
    refused = await http.post("/account/delete/", {"password": PASSWORD})
    assert refused.status_code == 400 and "Too many failed" in refused.content.decode()
    assert await acount(User, pk=user.pk) == 1


@pytest.mark.integration
@ws_db
async def test_staff_deleting_a_user_in_the_admin_does_the_same(scripted_ready):
    # The second account's "Paris." comes from the cache: the visitor still holds it.
    scripted_ready(Answer(("OK.",)), Answer(("Paris.",)), Answer(("OK.",)))
    _, user, things = await account_with_everything("alan")
    staff = AsyncClient()
    await staff.aforce_login(
        await sync_to_async(User.objects.create_superuser)("root", password="pw")
    )
    confirm = await staff.get(f"/admin/auth/user/{user.pk}/delete/")
    assert confirm.status_code == 200 and "Are you sure" in confirm.content.decode()
    assert (
        await staff.post(f"/admin/auth/user/{user.pk}/delete/", {"post": "yes"})
    ).status_code == 302
    assert await acount(User, pk=user.pk) == 0 and await acount(ApiKey) == 0
    assert await acount(Conversation, user_id=user.pk) == 0
    assert await sync_to_async(sessions_of)(user.pk) == 0
    assert await sync_to_async(apikey_authenticate)(things["secret"]) is None
    assert await acount(CachedAnswer) == 1 and len(cached_keys()) == 1  # the visitor's, kept

    # The changelist's delete action takes the same path.
    _, other_user, _ = await account_with_everything("barbara")
    response = await staff.post(
        "/admin/auth/user/",
        {"action": "delete_selected", "_selected_action": [other_user.pk], "post": "yes"},
    )
    assert response.status_code == 302 and await acount(User, pk=other_user.pk) == 0
    assert await acount(Conversation, user_id=other_user.pk) == 0


@pytest.mark.integration
@ws_db
async def test_the_account_export_holds_every_conversation_and_key(scripted_ready):
    scripted_ready(Answer(("OK.",)), Answer(("Paris.",)))
    http, user, _ = await account_with_everything("linus")
    exported = await http.get("/account/export", {"format": "json"})
    assert exported.status_code == 200 and exported["Content-Type"] == "application/json"
    assert 'filename="account-linus.json"' in exported["Content-Disposition"]
    data = exported.json()
    assert data["account"]["username"] == "linus"
    assert sorted(k["name"] for k in data["api_keys"]) == ["laptop", "script"]
    assert all(
        set(k) == {"name", "prefix", "created_at", "last_used_at", "revoked_at"}
        for k in data["api_keys"]
    )
    assert [c["title"] for c in data["conversations"]][-1] == "api"
    assert len(data["conversations"]) == 3
    texts = [m["text"] for c in data["conversations"] for m in c["messages"]]
    assert SECRET in texts and f"{PASSPORT} via API" in texts and "Paris." in texts
    # The request's own settings are the user's too: their system prompt above all.
    answers = {m["text"]: m for c in data["conversations"] for m in c["messages"]}
    assert answers["Noted."]["overrides"]["system_prompt"] == f"You know {PASSPORT}."
    assert answers["Noted."]["overrides"]["stop_strings"] == [";"]
    assert answers["Paris."]["overrides"] is None  # a page answer: its policy's settings alone
    markdown = (await http.get("/account/export", {"format": "markdown"})).content.decode()
    assert markdown.startswith("# Conversations of linus") and SECRET in markdown
    assert "## api (API key sk-" in markdown
    assert (await http.get("/account/export", {"format": "pdf"})).status_code == 400
    assert (await AsyncClient().get("/account/export")).status_code == 302  # signed in only


# -- retention and visitors' sessions ----------------------------------------------------


def age(conversation: Conversation, days: int) -> None:
    then = timezone.now() - timedelta(days=days)
    Conversation.objects.filter(pk=conversation.pk).update(updated_at=then)
    Message.objects.filter(conversation=conversation).update(created_at=then)


@pytest.mark.integration
@ws_db
async def test_purge_deletes_what_is_past_retention_and_visitors_whose_session_ended(
    scripted_ready, settings
):
    scripted_ready(Answer(("OK.",)), Answer(("Paris.",)))
    http, user = await signed_in("kay")
    old = await conversation_of(await ask(http, SECRET))  # its answer is only this one's
    recent = await conversation_of(await ask(http, "What is the capital of France?"))
    gone_visitor, live_visitor = await visitor(), await visitor()

    def setup():
        conversations = {
            "old": Conversation.objects.get(pk=old),
            "resumed": Conversation.objects.create(user=user, title="resumed"),
            "gone": Conversation.objects.create(
                session_key=gone_visitor.cookies["sessionid"].value, title="gone"
            ),
            "live": Conversation.objects.create(
                session_key=live_visitor.cookies["sessionid"].value, title="live"
            ),
        }
        age(conversations["old"], 40)
        age(conversations["resumed"], 40)
        Message.objects.create(conversation=conversations["resumed"], role="user", text="back")
        Session.objects.filter(session_key=conversations["gone"].session_key).update(
            expire_date=timezone.now() - timedelta(seconds=1)
        )
        return conversations

    conversations = await sync_to_async(setup)()
    settings.CHAT_RETENTION_DAYS = 0
    out = io.StringIO()
    await sync_to_async(call_command)("purge", stdout=out)
    assert "retention off" in out.getvalue()
    assert await acount(Conversation, pk=old) == 1  # unset: kept, however old
    assert await acount(Conversation, title="gone") == 0  # but the visitor's session ended
    assert await acount(Conversation, title="live") == 1

    settings.CHAT_RETENTION_DAYS = 30
    out = io.StringIO()
    await sync_to_async(call_command)("purge", stdout=out)
    assert "1 conversation(s) idle over 30 days" in out.getvalue()
    assert await acount(Conversation, pk=old) == 0
    remaining = await sync_to_async(set)(Conversation.objects.values_list("pk", flat=True))
    assert remaining == {recent, conversations["resumed"].pk, conversations["live"].pk}
    prompts = await sync_to_async(list)(CachedAnswer.objects.values_list("prompt", flat=True))
    assert prompts == ["What is the capital of France?"] and len(cached_keys()) == 1
    quiet = io.StringIO()
    await sync_to_async(call_command)("purge", verbosity=0, stdout=quiet)  # again: nothing to do
    assert await acount(Conversation) == 3 and quiet.getvalue() == ""


@pytest.mark.integration
@ws_db
async def test_a_purge_sweeps_what_a_stopped_process_left_between_a_deletion_and_its_sweep(
    scripted_ready, monkeypatch
):
    scripted_ready(Answer(("OK.",)))
    http = await visitor()
    done = await ask(http)
    sweep = erasure._sweep_after_commit
    monkeypatch.setattr(erasure, "_sweep_after_commit", lambda: None)  # the process died
    assert await delete(http, await conversation_of(done)) == 204
    assert await acount(CachedAnswerSource, conversation=None) == 1
    assert await acount(CachedAnswer) == 1 and len(cached_keys()) == 1
    monkeypatch.setattr(erasure, "_sweep_after_commit", sweep)
    await sync_to_async(call_command)("purge", stdout=io.StringIO())
    assert await acount(CachedAnswer) == 0 and cached_keys() == set()


@pytest.mark.unit
@pytest.mark.django_db
def test_the_migration_links_earlier_answers_and_releases_those_nobody_holds(
    django_capture_on_commit_callbacks,
):
    """Answers cached before 0008 name no conversation: the migration links each to the
    conversations holding its prompt, and a released link marks the ones whose conversation was
    already deleted (the issue's leftovers), so the next sweep erases them."""
    held = Conversation.objects.create(session_key="s", title="held")
    Message.objects.create(conversation=held, role="user", text="Tell me about owls")

    def legacy(key: str, prompt: str) -> CachedAnswer:
        return CachedAnswer.objects.create(
            key=key * 64,
            prompt=prompt,
            rendered_prompt=prompt,
            answer="...",
            finish_reason="eos",
            policy_slug="chat",
            policy_version=1,
            model_id="m",
        )

    owls, orphan = legacy("a", "Tell me about owls"), legacy("b", SECRET)
    importlib.import_module("chat.migrations.0010_erasure").link_existing(apps, None)
    assert list(owls.sources.values_list("conversation_id", flat=True)) == [held.pk]
    assert list(orphan.sources.values_list("conversation_id", flat=True)) == [None]
    with django_capture_on_commit_callbacks(execute=True):
        assert erasure.sources_sweep() == 1
    assert list(CachedAnswer.objects.values_list("pk", flat=True)) == [owls.pk]
    assert not PendingEviction.objects.exists()  # evicted after the sweep's commit


@pytest.mark.unit
@pytest.mark.django_db
def test_deleting_many_conversations_sweeps_once_after_the_commit(
    monkeypatch, django_capture_on_commit_callbacks
):
    sweeps, forgotten = [], []
    monkeypatch.setattr(erasure, "sources_sweep", lambda: sweeps.append(1))
    monkeypatch.setattr(erasure.turns, "conversations_forget", forgotten.append)
    ids = {Conversation.objects.create(session_key="s", title=f"c{n}").pk for n in range(3)}
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert erasure.conversations_erase(conversations=Conversation.objects.all()) == 3
        assert sweeps == [] and forgotten == []  # not before the commit
    # One sweep, the engine told once about all three, their answers' streams erased at once.
    assert len(callbacks) == 3 and sweeps == [1] and [set(f) for f in forgotten] == [ids]
