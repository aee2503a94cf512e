"""Feedback on answers over `POST /api/messages/<id>/feedback`: a user's own rating set, changed
and taken back; someone else's answer refused; bad bodies refused clearly; the rating reaching
a cached answer's review record; the implicit signals after a cache hit."""

import json
from datetime import timedelta

import pytest
from auditlog.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone
from prometheus_client import REGISTRY

from chat.models import CachedAnswer, Conversation, Feedback, Message, OutputPolicy
from chat.stores import apikeys, feedback, review
from chat.stores.cache import completion_cache
from chat.stores.selectors import Owner

pytestmark = [pytest.mark.unit, pytest.mark.django_db]


def visitor(**kwargs) -> Client:
    client = Client(**kwargs)
    client.get("/")
    return client


def member(*, age: timedelta = timedelta(days=2), **kwargs) -> Client:
    """A client signed in to an account made `age` ago."""
    user = User.objects.create_user(f"member{User.objects.count()}", password="pw")
    User.objects.filter(pk=user.pk).update(date_joined=timezone.now() - age)
    client = Client(**kwargs)
    client.force_login(user)
    return client


def answer_of(client: Client, *, cached: CachedAnswer | None = None, **fields) -> Message:
    user_id = client.session.get("_auth_user_id")
    conversation = (
        Conversation.objects.create(user_id=int(user_id))
        if user_id
        else Conversation.objects.create(session_key=client.session.session_key)
    )
    Message.objects.create(conversation=conversation, role="user", text="Tell me about owls")
    return Message.objects.create(
        conversation=conversation,
        role="assistant",
        text="Owls hunt at night.",
        cached_answer=cached,
        **fields,
    )


def rate(client: Client, message_id: int, body, **headers):
    raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(
        f"/api/messages/{message_id}/feedback", raw, content_type="application/json", **headers
    )


def test_a_user_sets_changes_and_takes_back_their_own_rating():
    client = visitor()
    message = answer_of(client)
    response = rate(client, message.pk, {"rating": -1, "comment": "  It is wrong. "})
    assert response.status_code == 200
    assert response.json() == {
        "message": message.pk,
        "rating": -1,
        "comment": "It is wrong.",
        "cached": False,
    }
    assert rate(client, message.pk, {"rating": 1}).json()["rating"] == 1  # changed, not added
    stored = Feedback.objects.get(message=message)
    assert (stored.kind, stored.rating, stored.comment) == ("rating", 1, "")
    detail = client.get(f"/api/conversations/{message.conversation_id}/").json()
    answer = detail["messages"][-1]
    assert answer["feedback"] == {"rating": 1, "comment": ""}
    assert "feedback" not in detail["messages"][0]  # the user's own prompt is not rated
    assert client.delete(f"/api/messages/{message.pk}/feedback").status_code == 204
    assert not Feedback.objects.filter(message=message).exists()
    assert client.delete(f"/api/messages/{message.pk}/feedback").status_code == 204  # idempotent
    detail = client.get(f"/api/conversations/{message.conversation_id}/").json()
    assert detail["messages"][-1]["feedback"] is None


def test_nobody_rates_someone_elses_answer_or_a_prompt_or_a_running_answer():
    owner, stranger = visitor(), visitor()
    message = answer_of(owner)
    for client, target in ((stranger, message.pk), (owner, message.pk - 1), (owner, 10**9)):
        response = rate(client, target, {"rating": -1})
        assert response.status_code == 404 and response.json()["code"] == "unknown_request"
    assert stranger.delete(f"/api/messages/{message.pk}/feedback").status_code == 404
    running = answer_of(owner, status=Message.Status.STREAMING)
    response = rate(owner, running.pk, {"rating": 1})
    assert response.status_code == 400 and response.json()["code"] == "bad_message"
    assert not Feedback.objects.exists()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        ([1], "not a JSON object"),
        ({}, "rating must be 1"),
        ({"rating": 2}, "rating must be 1"),
        ({"rating": "1"}, "rating must be 1"),
        ({"rating": True}, "rating must be 1"),
        ({"rating": 1.5}, "rating must be 1"),
        ({"rating": 0}, "send DELETE"),
        ({"rating": 1, "comment": 5}, "comment must be a string"),
        ({"rating": 1, "comment": "x" * 2001}, "over 2000 characters"),
        ({"rating": 1, "comment": "a\u0000b"}, "NUL"),
        ({"rating": 1, "stars": 5}, "unknown field 'stars'"),
    ],
)
def test_a_bad_body_is_refused_with_what_is_wrong(body, says):
    client = visitor()
    message = answer_of(client)
    response = rate(client, message.pk, body)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "bad_feedback" and says in response.json()["message"]
    assert not Feedback.objects.exists()


def test_an_oversized_body_and_a_wrong_method_are_refused():
    client = visitor()
    message = answer_of(client)
    response = rate(client, message.pk, {"rating": 1, "comment": "x" * 9000})
    assert response.status_code == 413 and response.json()["code"] == "frame_too_large"
    response = client.get(f"/api/messages/{message.pk}/feedback")
    assert response.status_code == 405 and response.json()["code"] == "method_not_allowed"


def test_a_session_needs_the_csrf_token_and_an_api_key_does_not():
    client = visitor(enforce_csrf_checks=True)
    message = answer_of(client)
    refused = rate(client, message.pk, {"rating": 1})
    assert refused.status_code == 403 and refused.json()["code"] == "csrf_failed"
    token = client.get("/api/csrf").json()["csrf_token"]
    assert rate(client, message.pk, {"rating": 1}, HTTP_X_CSRFTOKEN=token).status_code == 200

    user = User.objects.create_user("keyholder", password="pw")
    conversation = Conversation.objects.create(user=user)
    mine = Message.objects.create(conversation=conversation, role="assistant", text="Hi.")
    _, key = apikeys.apikey_create(user=user)
    bare = Client(enforce_csrf_checks=True)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    assert rate(bare, mine.pk, {"rating": -1, "comment": "meh"}, **auth).status_code == 200
    assert Feedback.objects.get(message=mine).comment == "meh"
    assert rate(bare, message.pk, {"rating": -1}, **auth).status_code == 404  # not the key's
    wrong = rate(bare, mine.pk, {"rating": 1}, HTTP_AUTHORIZATION="Bearer sk-nope")
    assert wrong.status_code == 401 and wrong.json()["code"] == "invalid_api_key"
    assert Feedback.objects.get(message=mine).rating == -1


def record_of(policy: OutputPolicy | None, *, status="pending") -> CachedAnswer:
    record = CachedAnswer.objects.create(
        key="f" * 64,
        prompt="Tell me about owls",
        rendered_prompt="...",
        answer="Owls hunt at night.",
        finish_reason="eos",
        policy=policy,
        policy_slug=policy.slug if policy else "gone",
        policy_version=1,
        model_id="m",
        status=status,
    )
    completion_cache.put(record.key, review.cache_entry(record), 60)
    return record


def served(record: CachedAnswer) -> bool:
    entry = completion_cache.get(record.key)
    return entry is not None and review.entry_servable(key=record.key, entry=entry)


def test_thumbs_down_from_enough_users_send_a_cached_answer_back_to_review(
    django_capture_on_commit_callbacks,
):
    policy = OutputPolicy.objects.create(name="p", slug="p", feedback_downs_to_review=2)
    record = record_of(policy, status="approved")
    first, second = member(), member()
    rate(first, answer_of(first, cached=record).pk, {"rating": -1, "comment": "Owls sleep."})
    # The same user again, on another hit: still one user.
    rate(first, answer_of(first, cached=record).pk, {"rating": -1})
    rate(second, answer_of(second, cached=record).pk, {"rating": 1})
    assert served(record) and feedback.downs_counted(record) == 1
    with django_capture_on_commit_callbacks(execute=True):  # the eviction runs after the commit
        response = rate(
            second, answer_of(second, cached=record).pk, {"rating": -1, "comment": "No."}
        )
    assert response.json()["cached"] is True
    record.refresh_from_db()
    assert record.status == "pending" and record.sent_back_at is not None
    assert completion_cache.get(record.key) is None  # evicted from Redis
    assert not review.servable(status=record.status, review_required=False, sent_back=True)
    (trail,) = LogEntry.objects.filter(additional_data__event="cachedanswer.send_back")
    # The account whose thumbs-down reached the threshold.
    assert trail.actor_id == int(second.session["_auth_user_id"])
    assert trail.changes == {"status": ["approved", "pending"]}

    # Approved after reading the comments: served again, and the downs it was sent back for do
    # not send it back a second time; new ones on answers served after the approval do.
    assert (
        review.answer_approve(
            record_id=record.pk, seen_digest=review.record_digest(record), by=None
        )
        is review.Approval.PUBLISHED
    )
    record.refresh_from_db()
    assert served(record) and record.sent_back_at is None and feedback.downs_counted(record) == 0
    later = member()
    rate(later, answer_of(later, cached=record).pk, {"rating": -1})
    record.refresh_from_db()
    assert record.sent_back_at is None and served(record)


def test_visitors_and_new_accounts_rate_but_never_send_an_answer_back():
    """A visitor's session and a fresh account cost nothing to make: their thumbs-down are
    stored, shown to them and to reviewers, and counted toward nothing."""
    policy = OutputPolicy.objects.create(name="v", slug="v", feedback_downs_to_review=3)
    record = record_of(policy, status="approved")
    strangers = [visitor() for _ in range(3)] + [member(age=timedelta(hours=1)) for _ in range(3)]
    for client in strangers:
        message = answer_of(client, cached=record)
        response = rate(client, message.pk, {"rating": -1, "comment": "Bad."})
        assert response.status_code == 200 and response.json()["cached"] is True
        shown = client.get(f"/api/conversations/{message.conversation_id}/").json()
        assert shown["messages"][-1]["feedback"] == {"rating": -1, "comment": "Bad."}
    assert Feedback.objects.filter(rating=-1).count() == 6
    record.refresh_from_db()
    assert record.sent_back_at is None and served(record) and feedback.downs_counted(record) == 0
    # Three accounts of a day's standing do count, through an API key as through a session.
    for n in range(3):
        client = member()
        user = User.objects.get(pk=client.session["_auth_user_id"])
        _, key = apikeys.apikey_create(user=user)
        auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if n == 0 else {}
        response = rate(client, answer_of(client, cached=record).pk, {"rating": -1}, **auth)
        assert response.status_code == 200
    record.refresh_from_db()
    assert record.sent_back_at is not None and not served(record)


def test_ratings_are_rate_limited_per_account_with_a_clear_429(monkeypatch):
    from chat.infra.ratelimit import feedback_limiter

    monkeypatch.setattr(feedback_limiter, "limit", 2)
    client, other = member(), member()
    messages = [answer_of(client) for _ in range(3)]
    assert rate(client, messages[0].pk, {"rating": -1}).status_code == 200
    assert client.delete(f"/api/messages/{messages[0].pk}/feedback").status_code == 204
    refused = rate(client, messages[1].pk, {"rating": -1})
    assert refused.status_code == 429 and refused.json()["code"] == "rate_limited"
    assert "too many ratings: at most 2 an hour" in refused.json()["message"]
    assert 0 < int(refused["Retry-After"]) <= 3600
    assert not Feedback.objects.filter(message=messages[1]).exists()
    assert rate(other, answer_of(other).pk, {"rating": 1}).status_code == 200  # per account


def test_a_threshold_of_zero_never_sends_back_and_rejected_answers_stay_rejected():
    never = OutputPolicy.objects.create(name="n", slug="n", feedback_downs_to_review=0)
    record = record_of(never)
    for _ in range(3):
        client = member()
        rate(client, answer_of(client, cached=record).pk, {"rating": -1})
    record.refresh_from_db()
    assert record.sent_back_at is None and served(record)
    record.status = "rejected"
    record.save()
    assert not feedback._send_back_if_due(record.pk)


def implicit_count(policy: str, signal: str) -> float:
    value = REGISTRY.get_sample_value("chat_feedback_total", {"policy": policy, "signal": signal})
    return value or 0.0


def test_a_stop_soon_after_a_cache_hit_is_an_implicit_signal_stored_apart():
    policy = OutputPolicy.objects.create(name="q", slug="q", feedback_downs_to_review=1)
    record = record_of(policy)
    client = visitor()
    owner = Owner(user_id=None, session_key=client.session.session_key)
    hit = answer_of(client, cached=record, policy=policy)
    before = implicit_count("q", "stopped")
    token = client.get("/api/csrf").json()["csrf_token"]
    response = client.post(
        "/api/chat/cancel",
        json.dumps({"message": hit.pk}),
        content_type="application/json",
        HTTP_X_CSRFTOKEN=token,
    )
    assert response.json()["result"] == "finished"
    assert Feedback.objects.get(message=hit).kind == "stopped"
    assert implicit_count("q", "stopped") == before + 1
    # Once per answer and kind; never a rating, never sending the answer back.
    assert not feedback.implicit_signal(owner=owner, message_id=hit.pk, kind="stopped")
    record.refresh_from_db()
    assert record.sent_back_at is None and feedback.downs_counted(record) == 0
    # Too late, or not a cache hit, or someone else's: nothing is noted.
    old = answer_of(client, cached=record)
    Message.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - feedback.IMPLICIT_WINDOW - timedelta(seconds=1)
    )
    fresh = answer_of(client)
    stranger = Owner(user_id=None, session_key=visitor().session.session_key)
    assert not feedback.implicit_signal(owner=owner, message_id=old.pk, kind="regenerated")
    assert not feedback.implicit_signal(owner=owner, message_id=fresh.pk, kind="regenerated")
    assert not feedback.implicit_signal(owner=stranger, message_id=hit.pk, kind="regenerated")
    assert feedback.implicit_signal(owner=owner, message_id=hit.pk, kind="regenerated")


def test_ratings_are_counted_per_policy_never_per_user():
    policy = OutputPolicy.objects.create(name="r", slug="r")
    client = visitor()
    message = answer_of(client, policy=policy)
    up, down = implicit_count("r", "up"), implicit_count("r", "down")
    rate(client, message.pk, {"rating": 1})
    rate(client, message.pk, {"rating": -1})
    assert (implicit_count("r", "up"), implicit_count("r", "down")) == (up + 1, down + 1)
    labels = {
        tuple(sorted(sample.labels))
        for metric in REGISTRY.collect()
        if metric.name == "chat_feedback"
        for sample in metric.samples
    }
    assert labels == {("policy", "signal")}


def test_the_behaviour_page_shows_feedback_per_policy_version():
    from chat.infra.feedback_report import feedback_by_version

    policy = OutputPolicy.objects.create(name="Rated", slug="rated")
    client = visitor()
    v1 = [answer_of(client, policy=policy, policy_version=1) for _ in range(3)]
    v2 = answer_of(client, policy=policy, policy_version=2)
    rate(client, v1[0].pk, {"rating": 1})
    rate(client, v1[1].pk, {"rating": -1, "comment": "no"})
    rate(client, v2.pk, {"rating": -1})
    Feedback.objects.create(message=v1[2], kind="regenerated")
    counts = feedback_by_version(timezone.now() - timedelta(hours=1), timezone.now())
    assert (counts[(policy.pk, 1)].up, counts[(policy.pk, 1)].down) == (1, 1)
    assert counts[(policy.pk, 1)].regenerated == 1 and counts[(policy.pk, 2)].down == 1

    staff = Client()
    staff.force_login(User.objects.create_superuser("staff", "s@example.com", "pw"))
    page = staff.get("/admin/behaviour/").content.decode()
    assert '<td class="feedback-up">1</td><td class="feedback-down">1</td>' in page
    assert '<td class="feedback-regenerated">1</td>' in page


def test_the_review_list_sorts_by_thumbs_down_and_hits():
    staff = Client()
    staff.force_login(User.objects.create_superuser("reviewer", "r@example.com", "pw"))
    records = []
    for n, (downs, hits) in enumerate([(1, 50), (3, 5), (0, 500)]):
        record = CachedAnswer.objects.create(
            key=f"{n}" * 64,
            prompt=f"prompt number {n}",
            rendered_prompt="...",
            answer="text",
            finish_reason="eos",
            policy_slug="chat",
            policy_version=1,
            model_id="m",
            hits=hits,
        )
        records.append(record)
        for _ in range(downs):
            client = member()
            rate(client, answer_of(client, cached=record).pk, {"rating": -1, "comment": f"c{n}"})

    def order(query: str) -> list[int]:
        page = staff.get(f"/admin/chat/cachedanswer/?{query}").content.decode()
        return sorted(range(3), key=lambda n: page.index(f"prompt number {n}"))

    # Columns: prompt, answer, status, hits (4), thumbs down (5). The first click on
    # thumbs down (o=5) puts the most on top.
    assert order("o=5") == [1, 0, 2]
    assert order("o=-4") == [2, 0, 1]
    detail = staff.get(f"/admin/chat/cachedanswer/{records[1].pk}/change/").content.decode()
    assert detail.count("c1") >= 3 and "3 of 3 thumbs-down" not in detail  # sent back already
    assert "Sent back to review" in detail


def test_a_rating_of_the_answer_that_made_the_record_counts_on_it(
    django_capture_on_commit_callbacks,
):
    """The record's first answer (its message's identity is the record's key, never served from
    it) is rated like any served one: shown with its comment in review, counted toward the
    send-back under the same rules (a visitor's shown, not counted; an unfinished one not at all)."""
    policy = OutputPolicy.objects.create(name="p", slug="p", feedback_downs_to_review=2)
    record = record_of(policy)
    maker = member()
    made = answer_of(maker, identity=record.key)
    rate(maker, made.pk, {"rating": -1, "comment": "Owls also hunt by day."})
    guest = visitor()
    rate(guest, answer_of(guest, identity=record.key).pk, {"rating": -1, "comment": "guest says"})
    failed = member()
    rate(failed, answer_of(failed, identity=record.key, status="failed").pk, {"rating": -1})
    assert feedback.downs_counted(record) == 1
    staff = Client()
    staff.force_login(User.objects.create_superuser("reviewer", "r@example.com", "pw"))
    listing = staff.get("/admin/chat/cachedanswer/").content.decode()
    assert '<span class="downs">2</span>' in listing  # the maker's and the visitor's
    detail = staff.get(f"/admin/chat/cachedanswer/{record.pk}/change/").content.decode()
    assert "Owls also hunt by day." in detail and "guest says" in detail
    assert "No ratings yet" not in detail and "1 of 2 thumbs-down" in detail

    served_to = member()
    with django_capture_on_commit_callbacks(execute=True):
        response = rate(served_to, answer_of(served_to, cached=record).pk, {"rating": -1})
    assert response.json()["cached"] is True
    record.refresh_from_db()
    assert record.sent_back_at is not None and record.status == "pending"


def test_the_feedback_admin_lists_ratings_read_only_filtered_by_policy_rating_and_comment():
    owls = OutputPolicy.objects.create(name="owls", slug="owls")
    cats = OutputPolicy.objects.create(name="cats", slug="cats")
    record = record_of(owls)
    someone = member()
    rate(
        someone,
        answer_of(someone, identity=record.key, policy=owls).pk,
        {"rating": -1, "comment": "wrong about owls"},
    )
    rate(someone, answer_of(someone, policy=owls).pk, {"rating": 1})
    rate(someone, answer_of(someone, policy=cats).pk, {"rating": -1, "comment": "cats comment"})
    reviewer = User.objects.create_user("rev", password="pw", is_staff=True)
    reviewer.user_permissions.add(Permission.objects.get(codename="review_cachedanswer"))
    staff = Client()
    staff.force_login(reviewer)

    def shown(query: str = "") -> str:
        response = staff.get(f"/admin/chat/feedback/?{query}")
        assert response.status_code == 200
        return response.content.decode()

    everything = shown()
    assert "wrong about owls" in everything and "cats comment" in everything
    assert f"/admin/chat/cachedanswer/{record.pk}/change/" in everything
    by_policy = shown(f"message__policy__id__exact={cats.pk}")
    assert "cats comment" in by_policy and "wrong about owls" not in by_policy
    ups = shown("rating=up")
    assert "Thumbs up" in ups and "cats comment" not in ups and "wrong about owls" not in ups
    commented_downs = shown("rating=down&commented=yes")
    assert "wrong about owls" in commented_downs and "cats comment" in commented_downs
    assert "Thumbs up" not in commented_downs.split('id="result_list"')[1]
    assert "Thumbs up" in shown("commented=no").split('id="result_list"')[1]
    one = Feedback.objects.exclude(comment="").first()
    assert staff.get(f"/admin/chat/feedback/{one.pk}/change/").status_code == 200
    assert staff.post(f"/admin/chat/feedback/{one.pk}/change/", {"comment": "x"}).status_code == 403
    assert staff.post(f"/admin/chat/feedback/{one.pk}/delete/", {"post": "yes"}).status_code == 403
    assert staff.get("/admin/chat/feedback/add/").status_code == 403
    one.refresh_from_db()
    assert one.comment != "x"
    outsider = Client()
    outsider.force_login(User.objects.create_user("plain", password="pw", is_staff=True))
    assert outsider.get("/admin/chat/feedback/").status_code == 403
