"""Feedback reaching review, live: the real model, real Redis, channels' communicator and the
database under test. Thumbs-down on cached answers send the answer back to review, after which
the next identical prompt is generated afresh; the review shows the comments and the implicit
signals apart."""

import json
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from chat.models import CachedAnswer, Feedback, OutputPolicy
from chat.stores.cache import completion_cache
from harness.scripted import Answer
from tests.test_cache import PROMPT, admin_client, ask, kinds

ws_db = pytest.mark.django_db(transaction=True)


def visitor() -> Client:
    client = Client()
    client.get("/")
    return client


async def visitor_socket(make_client):
    """A visitor: their HTTP client and their socket, one session."""
    http = await sync_to_async(visitor)()
    return http, await make_client(session_key=http.cookies["sessionid"].value)


async def member_socket(make_client):
    """A signed-in account of two days' standing: its HTTP client and its socket, one session."""

    def signed_in() -> Client:
        user = User.objects.create_user(f"member{User.objects.count()}", password="pw")
        User.objects.filter(pk=user.pk).update(date_joined=timezone.now() - timedelta(days=2))
        client = Client()
        client.force_login(user)
        return client

    http = await sync_to_async(signed_in)()
    return http, await make_client(session_key=http.cookies["sessionid"].value)


async def rate(http: Client, message_id: int, rating: int, comment: str = ""):
    response = await sync_to_async(http.post)(
        f"/api/messages/{message_id}/feedback",
        json.dumps({"rating": rating, "comment": comment}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    return response.json()


@pytest.mark.integration
@ws_db
async def test_thumbs_down_send_a_cached_answer_back_to_review_and_it_is_generated_afresh(
    make_client, runtime, example_policies
):
    await sync_to_async(OutputPolicy.objects.filter(slug="chat").update)(feedback_downs_to_review=2)
    _, first = await visitor_socket(make_client)
    generated = await ask(first)
    assert "chunk" in kinds(generated) and not generated[-1]["cached"]
    record = await sync_to_async(CachedAnswer.objects.get)()

    comments = ("It stops at nine.", "Numbers are missing.")
    for number, comment in enumerate(comments):
        http, chat = await member_socket(make_client)
        hit = (await ask(chat))[-1]
        assert hit["cached"] and hit["text"] == generated[-1]["text"]
        if number == 0:
            # A Stop right after the hit: an implicit signal, which sends nothing back.
            await chat.send({"type": "cancel", "request_id": "s1", "message": hit["message"]})
            assert (await chat.receive_until("cancel_ack"))[-1]["result"] == "finished"
            assert (await sync_to_async(CachedAnswer.objects.get)()).sent_back_at is None
        rated = await rate(http, hit["message"], -1, comment)
        assert rated["cached"] is True

    record = await sync_to_async(CachedAnswer.objects.get)(pk=record.pk)
    assert record.status == "pending" and record.sent_back_at is not None
    assert completion_cache.get(record.key) is None  # unpublished: out of Redis

    _, later = await visitor_socket(make_client)
    again = await ask(later)
    assert "chunk" in kinds(again) and not again[-1]["cached"]  # generated afresh
    kept = await sync_to_async(CachedAnswer.objects.get)(pk=record.pk)
    # Keep-first: the record still holds the text users rated, for the reviewer to read.
    assert (kept.answer, kept.status) == (record.answer, "pending")
    assert kept.sent_back_at is not None

    reviewer = await admin_client(review=True)
    listing = (await reviewer.get("/admin/chat/cachedanswer/?sent_back=yes&o=-7")).content.decode()
    assert "sent back to review" in listing and comments[-1] in listing
    page = (await reviewer.get(f"/admin/chat/cachedanswer/{record.pk}/change/")).content.decode()
    assert all(comment in page for comment in comments)
    assert "stopped 1 and regenerated 0 time(s)" in page


@pytest.mark.integration
@ws_db
async def test_visitors_thumbs_down_never_take_a_shared_answer_out_of_service(
    make_client, runtime, example_policies
):
    """Three cookie-less visitors rating a popular answer down: stored, and the next asker is
    still served it from the cache."""
    await sync_to_async(OutputPolicy.objects.filter(slug="chat").update)(feedback_downs_to_review=3)
    _, first = await visitor_socket(make_client)
    generated = await ask(first)
    assert not generated[-1]["cached"]
    for _ in range(3):
        http, chat = await visitor_socket(make_client)
        hit = (await ask(chat))[-1]
        assert hit["cached"]
        assert (await rate(http, hit["message"], -1, "Wrong."))["cached"] is True
    assert await sync_to_async(Feedback.objects.filter(rating=-1).count)() == 3
    record = await sync_to_async(CachedAnswer.objects.get)()
    assert record.sent_back_at is None

    _, later = await visitor_socket(make_client)
    again = (await ask(later))[-1]
    assert again["cached"] and again["text"] == generated[-1]["text"]


@pytest.mark.integration
@ws_db
async def test_a_regenerate_right_after_a_cache_hit_is_an_implicit_signal(
    make_client, example_policies, scripted
):
    """Regenerate's path through the turn (cache logic, so the answers are scripted)."""
    scripted(Answer(("Answer 1.",)), Answer(("Answer 2.",)))
    await ask(await make_client())
    http, chat = await visitor_socket(make_client)
    events = await ask(chat)
    accepted, hit = events[0], events[-1]
    assert hit["cached"]
    request_id = await chat.prompt(
        PROMPT, conversation=accepted["conversation"], replace=hit["message"]
    )
    regenerated = await chat.receive_until("done", request_id)
    assert regenerated[-1]["text"] == "Answer 2." and not regenerated[-1]["cached"]
    signal = await sync_to_async(Feedback.objects.get)(message_id=hit["message"])
    assert (signal.kind, signal.rating) == ("regenerated", None)
    record = await sync_to_async(CachedAnswer.objects.get)()
    assert record.sent_back_at is None
