"""Feedback in a real browser: thumbs down on a live answer, a comment typed and sent, the
rating stored and shown pressed after a reload; the review list's row with users' feedback
(the screenshot in docs/policies.md: `DOCS_SCREENSHOTS=1` writes it to docs/)."""

import json
import re
import uuid

import pytest
from playwright.sync_api import expect

from tests.test_browser import open_chat
from tests.test_browser_screenshots import target

pytestmark = pytest.mark.browser

PASSWORD = "feedback-pass-phrase-42"


def stored_feedback(server, message_id: int) -> list:
    code = (
        "import json; from chat.models import Feedback; "
        f"print(json.dumps(list(Feedback.objects.filter(message_id={message_id})"
        ".values_list('kind', 'rating', 'comment'))))"
    )
    return json.loads(server.manage("shell", "-c", code).strip().splitlines()[-1])


def test_thumbs_down_with_a_comment_is_stored_and_shown_after_a_reload(page, daphne_server):
    open_chat(page, daphne_server)
    page.fill("#prompt", "Say hello in three words.")
    page.keyboard.press("Enter")
    answer = page.locator(".message.assistant").last
    ended = re.compile("done|cancelled|invalid|retracted|error")
    expect(answer).to_have_attribute("data-state", ended, timeout=120_000)
    message_id = int(answer.evaluate("node => node.chatAnswer.messageId"))

    down = answer.get_by_role("button", name="Bad answer")
    expect(down).to_be_visible()
    expect(down).to_have_attribute("aria-pressed", "false")
    down.click()
    expect(down).to_have_attribute("aria-pressed", "true")
    comment = answer.get_by_label("What was good or wrong? (optional)")
    expect(comment).to_be_focused()  # the keyboard goes on where the comment is typed
    comment.type("It used four words.")
    answer.screenshot(path=str(target() / "rating.png"))
    answer.get_by_role("button", name="Send feedback").click()
    expect(comment).to_be_hidden()
    expect(page.locator("#announcer")).to_contain_text("feedback was sent")
    expect(answer.locator(".feedback-thanks")).to_be_visible()
    assert stored_feedback(daphne_server, message_id) == [["rating", -1, "It used four words."]]

    page.reload()
    again = page.locator(f'.message.assistant[data-message-id="{message_id}"]')
    expect(again.get_by_role("button", name="Bad answer")).to_have_attribute("aria-pressed", "true")
    # Pressing the pressed thumb again, from the keyboard, takes the rating back.
    again.get_by_role("button", name="Bad answer").focus()
    page.keyboard.press("Enter")
    expect(again.get_by_role("button", name="Bad answer")).to_have_attribute(
        "aria-pressed", "false"
    )
    assert stored_feedback(daphne_server, message_id) == []


SEED = """
from datetime import timedelta
from django.contrib.auth.models import User
from django.utils import timezone
from chat.models import CachedAnswer, Conversation, Feedback, Message
User.objects.create_superuser({name!r}, password={password!r})
rows = [
    ("How many legs does a spider have?", "A spider has six legs.", 120,
     ["Spiders have eight legs.", "Wrong: eight, not six."], 1, True),
    ("What is the boiling point of water?", "100 °C at sea level.", 340, [], 4, False),
    ("Name a prime number above 10.", "11 is prime.", 12, [], 0, False),
]
for n, (prompt, answer, hits, downs, ups, sent_back) in enumerate(rows):
    record = CachedAnswer.objects.create(
        key="{tag}%02d" % n + "0" * 56, prompt=prompt, rendered_prompt="...", answer=answer,
        finish_reason="eos", policy_slug="chat", policy_version=1, model_id="SmolLM2-135M-Instruct",
        status="pending" if sent_back else "approved", hits=hits,
        sent_back_at=timezone.now() if sent_back else None)
    for rating, comment in [(-1, c) for c in downs] + [(1, "") for _ in range(ups)]:
        chat = Conversation.objects.create(session_key="seed%s" % comment[:20])
        message = Message.objects.create(conversation=chat, role="assistant", text=answer,
                                         cached_answer=record)
        Feedback.objects.create(message=message, rating=rating, comment=comment)
    if sent_back:
        Feedback.objects.create(message=message, kind="stopped")
"""


def test_the_review_list_shows_and_sorts_by_feedback(browser, daphne_server):
    tag = uuid.uuid4().hex[:6]
    name = f"reviewer{tag}"
    daphne_server.manage("shell", "-c", SEED.format(name=name, password=PASSWORD, tag=tag))
    context = browser.new_context(viewport={"width": 1900, "height": 560}, color_scheme="light")
    page = context.new_page()
    try:
        page.goto(daphne_server.url + "/admin/login/?next=/admin/chat/cachedanswer/")
        page.fill("#id_username", name)
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.goto(f"{daphne_server.url}/admin/chat/cachedanswer/?q={tag}")
        # The first click puts the most thumbs-down on top.
        page.get_by_role("link", name=re.compile("thumbs down", re.I)).click()
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(3)
        expect(rows.first).to_contain_text("spider")
        expect(rows.first.locator(".field-thumbs_down")).to_contain_text("sent back to review")
        expect(rows.first.locator(".field-thumbs_down")).to_contain_text("eight legs")
        page.locator("#result_list").screenshot(path=str(target() / "review-feedback.png"))

        page.goto(f"{daphne_server.url}/admin/chat/cachedanswer/?q={tag}")
        page.get_by_role("link", name="Hits").click()
        page.get_by_role("link", name="Hits").first.click()
        expect(rows.first).to_contain_text("boiling point")
    finally:
        context.close()
