"""The admin latency page: the percentile maths, the bucketing, the bounded query, the page and who may see it."""

from __future__ import annotations

import random
import statistics
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser, Permission
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chat.admin.charts import nice_ceiling
from chat.admin.report_pages import build_chart, format_duration, format_ms, latency_view
from chat.infra import latency
from chat.models import Conversation, Message

pytestmark = pytest.mark.unit

URL = "/admin/latency/"
UNTIL = datetime(2025, 1, 2, 0, 0, tzinfo=UTC)


# -- percentile -----------------------------------------------------------------------------------


def test_percentile_interpolates_linearly_between_closest_ranks():
    assert latency.percentile([1, 2, 3, 4], 50) == 2.5
    assert latency.percentile([1, 2, 3, 4], 95) == pytest.approx(3.85)  # rank 2.85
    assert latency.percentile([15, 20, 35, 40, 50], 40) == pytest.approx(
        29.0
    )  # rank 1.6: 20 + 0.6 * 15
    assert latency.percentile([100, 200, 300, 400, 500], 95) == pytest.approx(480.0)
    assert latency.percentile([5, 1, 4, 2, 3], 50) == 3.0  # unsorted input


def test_percentile_edges():
    assert latency.percentile([], 50) is None
    assert latency.percentile([7], 95) == 7.0
    assert latency.percentile([3, 9, 1], 0) == 1.0
    assert latency.percentile([3, 9, 1], 100) == 9.0
    assert latency.percentile([2, 2, 2], 95) == 2.0
    assert latency.percentile(iter([1.5, 2.5]), 50) == 2.0  # any iterable
    for p in (-1, 100.5):
        with pytest.raises(ValueError, match="percentile must be within 0..100"):
            latency.percentile([1, 2], p)


def test_percentile_matches_the_standard_librarys_inclusive_quantiles():
    rng = random.Random(7)
    for _ in range(200):
        values = [rng.uniform(0, 5000) for _ in range(rng.randint(2, 60))]
        cuts = statistics.quantiles(
            values, n=100, method="inclusive"
        )  # cuts[k - 1] is the k-th percentile
        for p in (1, 25, 50, 90, 95, 99):
            assert latency.percentile(values, p) == pytest.approx(cuts[p - 1])


# -- parameters and bucketing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "hours"),
    [
        (None, 24),
        ("", 24),
        ("abc", 24),
        ("2.5", 24),
        ("24", 24),
        (" 6 ", 6),
        ("0", 1),
        ("-5", 1),
        ("720", 720),
        ("721", 720),
        ("99999", 720),
        (48, 48),
    ],
)
def test_parse_hours_defaults_and_clamps(raw, hours):
    assert latency.parse_hours(raw) == hours


def test_parse_flag():
    assert all(latency.parse_flag(v) for v in ("1", "true", "on", "yes", "TRUE"))
    assert not any(latency.parse_flag(v) for v in (None, "", "0", "false", "off", "no"))


def test_every_window_gets_24_to_48_buckets_covering_it_exactly():
    for hours in range(latency.MIN_HOURS, latency.MAX_HOURS + 1):
        width = latency.bucket_width(hours)
        since = UNTIL - timedelta(hours=hours)
        bounds = latency.bucket_bounds(since, UNTIL, width)
        assert 24 <= len(bounds) <= 48, hours
        assert bounds[0][0] == since and bounds[-1][1] == UNTIL
        assert all(a[1] == b[0] for a, b in pairwise(bounds))
        assert all(end - start <= width for start, end in bounds)
    assert latency.bucket_width(24) == timedelta(minutes=30)
    assert latency.bucket_width(1) == timedelta(minutes=2)
    assert latency.bucket_width(168) == timedelta(hours=6)
    assert latency.bucket_width(720) == timedelta(days=1)


def row(at, ttft=None, total=None, status="done", **extra):
    metrics = {"ttft_ms": ttft, "total_ms": total, "new_tokens": 5, **extra}
    return (at, status, metrics)


def test_rows_land_in_their_buckets():
    """24 h ending at midnight: 48 half-hour buckets, each (start, end]; outside the window is ignored."""
    since = UNTIL - timedelta(hours=24)
    rows = [
        row(since + timedelta(minutes=15), 100, 1000),  # bucket 0
        row(since, 110, 1100),  # the window's first instant: bucket 0
        row(since + timedelta(minutes=30), 120, 1200),  # a bucket's end is inside it: bucket 0
        row(since + timedelta(minutes=31), 200, 2000),  # bucket 1
        row(UNTIL - timedelta(minutes=10), 300, 3000),  # bucket 47
        row(UNTIL, 400, 4000),  # bucket 47
        row(since - timedelta(seconds=1), 9999, 9999),  # before the window
        row(UNTIL + timedelta(seconds=1), 9999, 9999),  # after it
    ]
    report = latency.summarize(rows, until=UNTIL, hours=24)
    assert len(report.buckets) == 48 and report.width == timedelta(minutes=30)
    counts = [b.count for b in report.buckets]
    assert counts[0] == 3 and counts[1] == 1 and counts[47] == 2 and sum(counts) == 6
    first, second, last = report.buckets[0], report.buckets[1], report.buckets[47]
    assert (first.start, first.end) == (since, since + timedelta(minutes=30))
    assert first.ttft_p50 == 110 and first.total_p95 == pytest.approx(
        1190
    )  # [1000, 1100, 1200]: rank 1.9
    assert second.ttft_p50 == second.ttft_p95 == 200
    assert last.ttft_p50 == 350 and last.total_p50 == 3500
    assert all(b.ttft_p50 is None for b in report.buckets[2:47])
    assert report.totals.count == 6 and report.totals.answers == 6
    assert report.oldest == since


def test_the_sample_leaves_out_cancelled_failed_unfinished_and_by_default_cached_answers():
    at = UNTIL - timedelta(hours=1)
    rows = [
        row(at, 100, 1000),
        row(at, 300, 3000),
        row(at, 9000, 9000, status="cancelled"),
        row(at, 8000, 8000, status="failed"),
        (at, "streaming", None),
        row(at, 2, 2, new_tokens=0, cached_new_tokens=40),
        row(at, 2, 2, new_tokens=0, cached_new_tokens=12),
        row(at, None, 5000),  # no TTFT: counts for the total only
        (at, "done", {"ttft_ms": "fast", "total_ms": True}),  # junk timings: left out
        (at, "done", "not a dict"),
    ]
    report = latency.summarize(rows, until=UNTIL, hours=24)
    totals = report.totals
    assert (totals.answers, totals.count, totals.cached, totals.cancelled, totals.failed) == (
        10,
        3,
        2,
        1,
        1,
    )
    assert totals.cached_share == pytest.approx(0.2)
    assert totals.ttft_p50 == 200 and totals.total_p50 == 3000

    with_cached = latency.summarize(rows, until=UNTIL, hours=24, include_cached=True)
    assert with_cached.totals.count == 5 and with_cached.totals.cached == 2
    assert with_cached.totals.ttft_p50 == 51  # [2, 2, 100, 300]: rank 1.5

    empty = latency.summarize([], until=UNTIL, hours=24)
    assert empty.is_empty and empty.totals.cached_share is None and empty.totals.ttft_p95 is None
    assert len(empty.buckets) == 48


def test_the_chart_breaks_its_lines_at_empty_buckets_and_has_round_axes():
    since = UNTIL - timedelta(hours=24)
    rows = [
        row(since + timedelta(minutes=15 + 30 * i), 100 * (i + 1), 1000) for i in (0, 1, 2, 10, 11)
    ]
    chart = build_chart(latency.summarize(rows, until=UNTIL, hours=24), "ttft", "TTFT")
    p50 = next(s for s in chart.series if s.key == "p50")
    assert len(p50.segments) == 2 and len(p50.points) == 5
    assert [len(s.split()) for s in p50.segments] == [3, 2]
    assert [t["label"] for t in chart.y_ticks] == ["0 ms", "500 ms", "1 s", "1.5 s"]
    assert 4 <= len(chart.x_ticks) <= 8 and chart.x_ticks[0]["label"] == "00:00"
    assert (
        nice_ceiling(850) == (1000, 250)
        and nice_ceiling(1000) == (1000, 250)
        and nice_ceiling(0) == (1.0, 0.25)
    )
    assert (format_ms(None), format_ms(480), format_ms(8800), format_ms(12345)) == (
        "—",
        "480 ms",
        "8.80 s",
        "12.3 s",
    )
    assert [format_duration(timedelta(minutes=m)) for m in (1, 30, 60, 360, 1440)] == [
        "1 minute",
        "30 minutes",
        "1 hour",
        "6 hours",
        "1 day",
    ]


# -- the database --------------------------------------------------------------------------------


def store(conversation, *, ago, status="done", role="assistant", **metrics):
    message = Message.objects.create(
        conversation=conversation,
        role=role,
        status=status,
        metrics=metrics or None,
        finish_reason="eos" if status == "done" else status,
    )
    Message.objects.filter(pk=message.pk).update(created_at=timezone.now() - ago)
    return message


@pytest.fixture
def known_data():
    """Five finished answers (TTFT 100..500 ms; total 1, 2, 3, 4, 10 s) and the noise around them."""
    conversation = Conversation.objects.create(session_key="s", title="latency")
    for i, (ttft, total) in enumerate(
        zip((100, 200, 300, 400, 500), (1000, 2000, 3000, 4000, 10000), strict=True)
    ):
        store(
            conversation,
            ago=timedelta(hours=i + 1),
            ttft_ms=ttft,
            ttfv_ms=ttft,
            total_ms=total,
            queue_ms=1,
            new_tokens=20,
            tokens_per_s=15.0,
        )
    store(
        conversation,
        ago=timedelta(minutes=5),
        ttft_ms=2,
        total_ms=2,
        new_tokens=0,
        cached_new_tokens=20,
    )
    store(
        conversation,
        ago=timedelta(minutes=6),
        status="cancelled",
        ttft_ms=9000,
        total_ms=9000,
        new_tokens=3,
    )
    store(conversation, ago=timedelta(minutes=7), status="streaming")
    store(conversation, ago=timedelta(minutes=8), role="user")
    store(
        conversation, ago=timedelta(hours=30), ttft_ms=7777, total_ms=7777, new_tokens=5
    )  # before the window
    return conversation


@pytest.mark.django_db
def test_the_report_from_stored_messages(known_data):
    report = latency.latency_report(24)
    totals = report.totals
    assert (totals.answers, totals.count, totals.cached, totals.cancelled) == (8, 5, 1, 1)
    assert (totals.ttft_p50, totals.ttft_p95) == (300, pytest.approx(480))
    assert (totals.total_p50, totals.total_p95) == (3000, pytest.approx(8800))
    assert latency.latency_report(24, include_cached=True).totals.ttft_p50 == 250  # [2, 100..500]
    assert latency.latency_report(48).totals.count == 6


@pytest.mark.django_db
def test_the_query_is_one_bounded_select_of_three_columns(known_data):
    now = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        rows, truncated = latency.fetch_answers(now - timedelta(hours=24), now)
    assert len(queries) == 1 and not truncated and len(rows) == 8
    sql = queries[0]["sql"]
    assert f"LIMIT {latency.MAX_ROWS + 1}" in sql
    selected = sql.split(" FROM ")[0]
    assert "metrics" in selected and "created_at" in selected and '"text"' not in selected
    assert "raw_text" not in selected

    report = latency.latency_report(24, limit=3)  # the newest three: cached, cancelled, streaming
    assert report.truncated and report.totals.answers == 3 and report.totals.count == 0


# -- the page ----------------------------------------------------------------------------------


@pytest.fixture
def superuser(db):
    return get_user_model().objects.create_superuser("root", "root@example.com", "pw")


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_user("staff", "staff@example.com", "pw", is_staff=True)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def get(user, query=""):
    request = RequestFactory().get(URL + query)
    request.user = user
    response = latency_view(request)
    response.render()
    return response


@pytest.mark.django_db
def test_the_view_needs_the_view_message_permission(staff):
    with pytest.raises(PermissionDenied):
        get(staff)
    with pytest.raises(PermissionDenied):
        get(AnonymousUser())
    staff.user_permissions.add(
        Permission.objects.get(codename="view_message", content_type__app_label="chat")
    )
    staff = get_user_model().objects.get(pk=staff.pk)  # a fresh permission cache
    assert get(staff).status_code == 200
    outsider = get_user_model().objects.create_user("outsider", password="pw")
    outsider.user_permissions.add(
        Permission.objects.get(codename="view_message", content_type__app_label="chat")
    )
    with pytest.raises(PermissionDenied):
        get(get_user_model().objects.get(pk=outsider.pk))  # not staff


@pytest.mark.django_db
def test_the_view_clamps_its_parameters(superuser):
    html = get(superuser, "?hours=99999&include_cached=yes").content.decode()
    assert 'value="720"' in html and "checked" in html and "cached answers included" in html
    assert "in 30 buckets of 1 day" in html
    html = get(superuser, "?hours=nonsense").content.decode()
    assert 'value="24"' in html and "cached answers left out" in html


@pytest.mark.django_db
def test_the_page_plots_the_known_data(superuser, known_data):
    response = logged_in(superuser).get(URL)
    assert response.status_code == 200
    assert response.templates[0].name == "admin/chat/latency.html"
    html = response.content.decode()
    assert (
        html.count('<svg class="latency-chart"') == 2
        and "<polyline" in html
        and "Time to first token" in html
    )
    assert 'id="total-count">5<' in html
    assert 'id="ttft-p50">300 ms<' in html and 'id="ttft-p95">480 ms<' in html
    assert 'id="total-p50">3.00 s<' in html and 'id="total-p95">8.80 s<' in html
    assert 'id="cached-share">12%<' in html and 'id="cancelled">1<' in html  # 1 of 8
    # The charts take the admin's colours from its stylesheet (a file: the CSP allows no inline style).
    stylesheet = (Path(settings.BASE_DIR) / "static" / "chat" / "latency.css").read_text()
    assert "chat/latency.css" in html and "<style" not in html
    assert "var(--link-fg)" in stylesheet and "var(--body-fg)" in stylesheet
    assert "<script" not in html.split('id="content-main"')[1]
    assert 'id="latency-empty"' not in html

    html = logged_in(superuser).get(URL + "?include_cached=1").content.decode()
    assert 'id="total-count">6<' in html and 'id="ttft-p50">250 ms<' in html


@pytest.mark.django_db
def test_the_page_shows_an_empty_state(superuser):
    response = logged_in(superuser).get(URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert (
        'id="latency-empty"' in html
        and "No finished answers" in html
        and 'latency-chart"' not in html
    )

    conversation = Conversation.objects.create(session_key="s")
    store(
        conversation,
        ago=timedelta(minutes=1),
        ttft_ms=2,
        total_ms=2,
        new_tokens=0,
        cached_new_tokens=9,
    )
    html = logged_in(superuser).get(URL).content.decode()
    assert 'id="latency-empty"' in html and "include them" in html and "include_cached=1" in html
    html = logged_in(superuser).get(URL + "?include_cached=1").content.decode()
    assert 'id="latency-empty"' not in html and '<svg class="latency-chart"' in html


@pytest.mark.django_db
def test_staff_without_the_permission_get_403(staff):
    assert logged_in(staff).get(URL).status_code == 403


@pytest.mark.django_db
def test_anonymous_visitors_are_sent_to_the_admin_login():
    response = Client().get(URL)
    assert response.status_code == 302
    assert response["Location"] == f"/admin/login/?next={URL}"


@pytest.mark.django_db
def test_the_page_is_read_only(superuser):
    assert logged_in(superuser).post(URL).status_code == 405
