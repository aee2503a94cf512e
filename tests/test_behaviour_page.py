"""How each policy behaves in production: the counting, the query, the page and the admin index."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from chat.infra import behaviour
from chat.models import Conversation, Message, OutputPolicy

pytestmark = pytest.mark.unit

UNTIL = datetime(2025, 1, 2, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("finish", "retries", "same", "prefix", "has_raw", "kinds"),
    [
        ("eos", 0, True, True, True, {"delivered"}),
        ("length", 0, True, True, True, {"delivered"}),
        ("stop_string", 2, True, True, True, {"delivered", "reasked"}),
        ("eos", 0, False, False, True, {"masked"}),
        ("eos", 0, False, False, False, {"delivered"}),  # stored before raw texts were kept
        ("invalid", 1, False, False, True, {"fell_back", "reasked"}),
        ("invalid", 0, False, True, True, {"refused"}),  # buffer mode: the user kept nothing
        ("moderated", 0, False, True, True, {"moderated"}),
        ("cut", 0, False, True, True, {"cut"}),
        ("cancelled", 0, True, True, True, set()),
    ],
)
def test_each_finished_answer_counts_as_its_kinds(finish, retries, same, prefix, has_raw, kinds):
    assert behaviour.kinds_of(finish, retries, same, prefix, has_raw) == kinds


def row(minutes_ago, policy, version, finish, *, status="done", retries=0, same=True, prefix=True):
    at = UNTIL - timedelta(minutes=minutes_ago)
    return (at, policy, version, status, finish, retries, same, prefix, True)


def test_shares_per_version_and_over_time_for_the_selected_policy():
    rows = [
        row(10, 1, 2, "eos"),
        row(10, 1, 2, "moderated", same=False),
        row(45, 1, 2, "invalid", retries=1, same=False, prefix=False),
        row(20, 1, 2, "eos", status="cancelled"),
        row(700, 1, 1, "cut", same=False),
        row(700, 1, 1, "eos", status="failed"),
        row(30, 2, 1, "eos", same=False, prefix=False),
        row(60 * 25, 1, 2, "eos"),  # before the window
    ]
    report = behaviour.summarize(rows, until=UNTIL, hours=24, policy_id=1)
    assert list(report.versions) == [(1, 2), (1, 1), (2, 1)]  # newest version first
    v2 = report.versions[(1, 2)]
    assert (v2.finished, v2.cancelled, v2.failed) == (3, 1, 0)
    assert v2.share("delivered") == pytest.approx(1 / 3)
    assert v2.share("moderated") == pytest.approx(1 / 3)
    assert v2.share("fell_back") == pytest.approx(1 / 3)
    assert v2.share("reasked") == pytest.approx(1 / 3)
    assert report.versions[(2, 1)].share("masked") == 1.0
    # The selected policy's totals and buckets leave policy 2 out.
    assert report.totals.finished == 4 and report.totals.failed == 1
    assert report.totals.share("cut") == pytest.approx(1 / 4)
    assert sum(b.counts.finished for b in report.buckets) == 4
    newest = report.buckets[-1].counts
    assert newest.finished == 2 and newest.share("moderated") == 0.5
    only_v1 = behaviour.summarize(rows, until=UNTIL, hours=24, policy_id=1, version=1)
    assert only_v1.totals.finished == 1 and only_v1.totals.share("cut") == 1.0
    empty = behaviour.summarize([], until=UNTIL, hours=24)
    assert empty.is_empty and empty.totals.share("delivered") is None


def answer(conversation, policy, *, text, raw, finish, status="done", retries=0):
    return Message.objects.create(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        text=text,
        raw_text=raw,
        finish_reason=finish,
        status=status,
        retries=retries,
        policy=policy,
        policy_version=policy.version,
    )


@pytest.fixture
def stored_answers(db):
    policy = OutputPolicy.objects.create(name="Answers", slug="answers")
    chat = Conversation.objects.create(session_key="s")
    answer(chat, policy, text="Hello.", raw="Hello.", finish="eos")
    answer(chat, policy, text="Mail [email].", raw="Mail a@b.example.", finish="eos")
    answer(chat, policy, text="Sorry, no.", raw='{"bad"', finish="invalid", retries=2)
    answer(chat, policy, text="", raw='{"bad"', finish="invalid")
    # LIKE's wildcards in the text are plain characters: "1_0" does not begin "100 apples".
    answer(chat, policy, text="1_0", raw="100 apples", finish="invalid")
    answer(chat, policy, text="Red.", raw="Red. Red. Red. Red. Red.", finish="cut")
    answer(chat, policy, text="", raw="rude words", finish="moderated")
    answer(
        chat, policy, text="50% off_", raw="50% off_ today", finish="cancelled", status="cancelled"
    )
    Message.objects.create(conversation=chat, role=Message.Role.USER, text="not an answer")
    return policy


def test_the_database_compares_the_texts(stored_answers):
    report = behaviour.behaviour_report(24)
    counts = report.versions[(stored_answers.pk, 1)]
    assert (counts.finished, counts.cancelled) == (7, 1)
    assert counts.kinds == {
        "delivered": 1,
        "masked": 1,
        "fell_back": 2,
        "refused": 1,
        "reasked": 1,
        "cut": 1,
        "moderated": 1,
    }


def test_the_page_shows_each_version_and_the_selected_policy_over_time(stored_answers):
    staff = Client()
    staff.force_login(User.objects.create_superuser("staff", "s@example.com", "pw"))
    page = staff.get("/admin/behaviour/").content.decode()
    assert "Answers" in page and 'id="behaviour-versions"' in page
    assert "14%" in page and "29%" in page  # one and two of seven finished answers
    selected = staff.get(f"/admin/behaviour/?policy={stored_answers.pk}&version=1")
    html = selected.content.decode()
    assert selected.status_code == 200 and "Over time: Answers v1" in html
    assert 'id="chart-behaviour-title"' in html and "polyline" in html
    assert 'id="share-cut">14%' in html
    none = staff.get("/admin/behaviour/?policy=999&hours=junk").content.decode()
    assert 'id="behaviour-empty"' in none
    index = staff.get("/admin/").content.decode()
    assert 'href="/admin/latency/"' in index and 'href="/admin/behaviour/"' in index


def test_the_page_needs_staff_with_the_view_message_permission(db):
    member = Client()
    member.force_login(User.objects.create_user("m", password="pw", is_staff=True))
    assert member.get("/admin/behaviour/").status_code == 403
    assert 'href="/admin/behaviour/"' not in member.get("/admin/").content.decode()
    anonymous = Client().get("/admin/behaviour/")
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]


def test_an_answer_stored_now_is_in_the_newest_bucket(stored_answers):
    report = behaviour.behaviour_report(1, policy_id=stored_answers.pk, now=timezone.now())
    assert report.buckets[-1].counts.finished == 7
