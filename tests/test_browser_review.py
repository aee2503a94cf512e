"""The cached-answer review list in a real browser: excerpts side by side, one-click pending,
reject per row, approve on the detail page (which renders the answer), and the approve URL's
guards."""

import uuid

import pytest
from playwright.sync_api import expect

PASSWORD = "review-pass-phrase-42"

SEED = """
from django.contrib.auth.models import User
from chat.models import CachedAnswer
User.objects.create_superuser({name!r}, password={password!r})
for n, status in enumerate(["pending", "pending", "approved"]):
    CachedAnswer.objects.create(
        key="{tag}%02d" % n + "0" * 54, prompt="{tag} prompt %d" % n, rendered_prompt="...",
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
    expect(first.locator(".field-answer_excerpt")).to_contain_text("# Heading 0")

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
    expect(rows.filter(has_text=f"{tag} prompt 0").locator(".field-status")).to_have_text(
        "Approved"
    )
    expect(rows.filter(has_text=f"{tag} prompt 1").locator(".field-status")).to_contain_text(
        "rejected"
    )

    rows.filter(has_text=f"{tag} prompt 2").locator("th a").click()
    rendered = page.locator(".rendered-answer")
    expect(rendered.locator("h1")).to_have_text("Heading 2")
    expect(rendered.locator("code.language-python")).to_have_text("print(2)\n")


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
