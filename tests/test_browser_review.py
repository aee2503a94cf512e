"""The cached-answer review list in a real browser: excerpts side by side, one-click pending,
reject per row, approve on the detail page (which renders the answer), approve and next, the
feedback on the answer that made a record, the admin home's links, and the approve URL's
guards."""

import uuid

import pytest
from playwright.sync_api import expect

from tests.a11y import serious_violations

PASSWORD = "review-pass-phrase-42"

SEED = """
from django.contrib.auth.models import User
from chat.models import CachedAnswer
User.objects.create_superuser({name!r}, password={password!r})
for n, status in enumerate(["pending", "pending", "approved"]):
    CachedAnswer.objects.create(
        key="{tag}%02d" % n + "0" * 52, prompt="{tag} prompt %d" % n, rendered_prompt="...",
        answer="# Heading %d\\n\\n```python\\nprint(%d)\\n```" % (n, n), finish_reason="eos",
        policy_slug="chat", policy_version=1, model_id="m", status=status)
"""


@pytest.mark.browser
def test_review_list_rejects_per_row_and_the_detail_page_renders_and_approves(page, daphne_server):
    tag = uuid.uuid4().hex[:10]
    name = f"admin{tag}"
    daphne_server.manage("shell", "-c", SEED.format(name=name, password=PASSWORD, tag=tag))
    page.goto(daphne_server.url + "/admin/login/?next=/admin/chat/cachedanswer/")
    page.fill("#id_username", name)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.fill("#searchbar", tag)
    page.keyboard.press("Enter")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(3)
    first = rows.filter(has_text=f"{tag} prompt 0")
    # Rendered as the chat renders it, not raw Markdown.
    expect(first.locator(".field-answer_excerpt h1")).to_have_text("Heading 0")

    page.click("#pending-filter")
    page.wait_for_url("**status__exact=pending**")
    page.fill("#searchbar", tag)
    page.keyboard.press("Enter")
    expect(rows).to_have_count(2)

    first = rows.filter(has_text=f"{tag} prompt 0")
    expect(first.locator("button.review-approve")).to_have_count(0)  # never from an excerpt
    first.locator("a.review-read").click()
    expect(page.locator(".rendered-answer h1")).to_have_text("Heading 0")
    page.click("#review-approve")
    expect(page.locator(".messagelist")).to_contain_text("Approved")
    page.goto(f"{daphne_server.url}/admin/chat/cachedanswer/?q={tag}")
    rows.filter(has_text=f"{tag} prompt 1").locator("button.review-reject").click()
    expect(page.locator(".messagelist")).to_contain_text("Rejected")
    page.goto(f"{daphne_server.url}/admin/chat/cachedanswer/?q={tag}")
    expect(rows.filter(has_text=f"{tag} prompt 0").locator(".field-review_status")).to_have_text(
        "Approved"
    )
    expect(rows.filter(has_text=f"{tag} prompt 1").locator(".field-review_status")).to_contain_text(
        "rejected"
    )

    rows.filter(has_text=f"{tag} prompt 2").locator("th a").click()
    rendered = page.locator(".rendered-answer")
    expect(rendered.locator("h1")).to_have_text("Heading 2")
    expect(rendered.locator("code.language-python")).to_have_text("print(2)\n")


def sign_in(page, server, name: str, then: str) -> None:
    page.goto(f"{server.url}/admin/login/?next={then}")
    page.fill("#id_username", name)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")


MADE_AND_RATED = """
from datetime import timedelta
from django.contrib.auth.models import User
from django.utils import timezone
from chat.models import CachedAnswer, Conversation, Feedback, Message
User.objects.create_superuser({name!r}, password={password!r})
rater = User.objects.create_user({name!r} + "-user", password={password!r})
User.objects.filter(pk=rater.pk).update(date_joined=timezone.now() - timedelta(days=2))
key = "{tag}" + "0" * 54
conversation = Conversation.objects.create(user=rater)
Message.objects.create(conversation=conversation, role="user", text="{tag} prompt")
made = Message.objects.create(conversation=conversation, role="assistant", text="Owls **sleep**.",
                              identity=key)
CachedAnswer.objects.create(key=key, prompt="{tag} prompt", rendered_prompt="...",
    answer="Owls **sleep**.", finish_reason="eos", policy_slug="chat", policy_version=1,
    model_id="m", status="pending")
Feedback.objects.create(message=made, rating=-1, comment="{tag} they hunt at night")
"""


@pytest.mark.browser
def test_feedback_on_the_answer_that_made_a_record_shows_in_its_review(axe_page, daphne_server):
    """The user who got the record's first answer rated it down with a comment: the list counts
    it and shows the comment, its page lists it; the review column is in view at 1280 px."""
    page = axe_page
    tag = uuid.uuid4().hex[:10]
    name = f"admin{tag}"
    daphne_server.manage(
        "shell", "-c", MADE_AND_RATED.format(name=name, password=PASSWORD, tag=tag)
    )
    page.set_viewport_size({"width": 1280, "height": 800})
    sign_in(page, daphne_server, name, f"/admin/chat/cachedanswer/?q={tag}")
    row = page.locator("#result_list tbody tr").filter(has_text=f"{tag} prompt")
    expect(row.locator(".downs")).to_have_text("1")
    expect(row.locator(".feedback-comment")).to_have_text(f"{tag} they hunt at night")
    expect(row.locator(".field-answer_excerpt strong")).to_have_text("sleep")
    action = row.locator("a.review-read").bounding_box()
    assert action is not None and action["x"] + action["width"] <= 1280
    table, area = page.evaluate(
        "() => { const t = document.querySelector('#result_list');"
        " return [t.scrollWidth, t.parentElement.clientWidth]; }"
    )
    assert table <= area
    assert serious_violations(page) == []

    row.locator("a.review-read").click()
    panel = page.locator(".field-feedback_panel")
    expect(panel).to_contain_text(f"{tag} they hunt at night")
    expect(panel).not_to_contain_text("No ratings yet")
    expect(panel).to_contain_text("1 of 3 thumbs-down")
    # The text and the review buttons come before the record's details.
    answer_y = page.locator(".rendered-answer").bounding_box()["y"]
    approve_y = page.locator("#review-approve").bounding_box()["y"]
    details_y = page.locator(".field-rendered_prompt").bounding_box()["y"]
    assert answer_y < approve_y < details_y
    assert serious_violations(page) == []

    page.goto(f"{daphne_server.url}/admin/chat/feedback/?commented=yes&q={tag}")
    page.locator("#result_list a.feedback-review").first.click()
    expect(page.locator(".field-feedback_panel")).to_contain_text(f"{tag} they hunt at night")


@pytest.mark.browser
def test_the_admin_home_links_are_never_narrower_than_their_text(axe_page, daphne_server):
    page = axe_page
    name = f"admin{uuid.uuid4().hex[:10]}"
    daphne_server.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User; "
        f"User.objects.create_superuser({name!r}, password={PASSWORD!r})",
    )
    sign_in(page, daphne_server, name, "/admin/")
    expect(page.locator("#report-behaviour")).to_be_visible()
    for width in (1280, 1440, 1920):
        page.set_viewport_size({"width": width, "height": 900})
        # An inline link broken over lines has a box per line; a block one is narrower than
        # what it scrolls.
        squeezed = page.evaluate(
            """() => [...document.querySelectorAll('#content a')]
                .filter((a) => a.getClientRects().length > 1
                               || a.getBoundingClientRect().width + 1 < a.scrollWidth)
                .map((a) => a.textContent.trim())"""
        )
        assert squeezed == [], f"at {width} px"
    assert serious_violations(page) == []


THREE_PENDING = """
from django.contrib.auth.models import User
from chat.models import CachedAnswer
CachedAnswer.objects.filter(status="pending").update(status="rejected")  # earlier tests' own
User.objects.create_superuser({name!r}, password={password!r})
for n in range(3):
    CachedAnswer.objects.create(
        key="{tag}%02d" % n + "0" * 52, prompt="{tag} prompt %d" % n, rendered_prompt="...",
        answer="{tag} answer %d" % n, finish_reason="eos", policy_slug="chat", policy_version=1,
        model_id="m", status="pending")
"""


@pytest.mark.browser
def test_approve_and_next_goes_through_the_pending_answers(page, daphne_server):
    """Each press approves the text shown (its digest) and opens another pending answer; the
    last one leads back to the pending list."""
    tag = uuid.uuid4().hex[:10]
    name = f"admin{tag}"
    daphne_server.manage("shell", "-c", THREE_PENDING.format(name=name, password=PASSWORD, tag=tag))
    sign_in(page, daphne_server, name, f"/admin/chat/cachedanswer/?q={tag}&status__exact=pending")
    page.locator("#result_list a.review-read").first.click()
    seen = []
    for _ in range(3):
        # The answer is rendered by the page's script: read it once it is there.
        expect(page.locator(".rendered-answer")).to_contain_text(f"{tag} answer")
        seen.append(page.locator(".rendered-answer").inner_text().strip())
        # The page before already says "Approved": wait for the next one, not for the words.
        with page.expect_navigation():
            page.click("#review-approve-next")
        expect(page.locator(".messagelist")).to_contain_text("Approved")
    assert sorted(seen) == [f"{tag} answer {n}" for n in range(3)]
    page.wait_for_url("**status__exact=pending**")
    statuses = daphne_server.manage(
        "shell",
        "-c",
        "from chat.models import CachedAnswer; print(sorted(set(CachedAnswer.objects.filter("
        f"prompt__startswith={tag!r}).values_list('status', flat=True))))",
    )
    assert statuses.strip().splitlines()[-1] == "['approved']"


@pytest.mark.unit
def test_approve_needs_post_the_review_permission_and_the_pages_digest(db):
    """A GET changes nothing; staff without "Can review cached answers" are refused; a post
    without the digest of the text the page showed approves nothing."""
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    from chat.models import CachedAnswer
    from chat.stores.review import record_digest

    record = CachedAnswer.objects.create(
        key="r" * 64,
        prompt="p",
        rendered_prompt="p",
        answer="a",
        finish_reason="eos",
        policy_slug="chat",
        policy_version=1,
        model_id="m",
    )
    viewer = User.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_cachedanswer"))
    client = Client()
    client.force_login(viewer)
    url = f"/admin/chat/cachedanswer/{record.pk}/approve/"
    page = client.get(f"/admin/chat/cachedanswer/{record.pk}/change/")
    assert page.status_code == 200 and b"seen_digest" not in page.content  # read-only for them
    assert b"review-approve" not in page.content
    assert client.get(url).status_code == 405
    assert client.post(url).status_code == 403
    reviewer = User.objects.create_superuser("boss", password=PASSWORD)
    client.force_login(reviewer)
    assert client.post(url).status_code == 302
    record.refresh_from_db()
    assert record.status == "pending"
    assert client.post(url, {"seen_digest": record_digest(record)}).status_code == 302
    record.refresh_from_db()
    assert record.status == "approved" and record.reviewed_by == reviewer
