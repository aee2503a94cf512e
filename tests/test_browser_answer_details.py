"""An answer's details in Chromium: the timing line folded behind its "i" toggle, the visible
thanks for sent feedback, and the phone's top bar (the model's name whole, nothing over the
first message); axe-core at 0 serious or critical."""

import pytest
from playwright.sync_api import expect

from tests.a11y import axe_context, serious_violations
from tests.test_browser import open_chat
from tests.test_browser_accounts import ask
from tests.test_browser_answers import short_policy
from tests.test_browser_screenshots import sign_up

pytestmark = pytest.mark.browser


def test_timing_shows_on_demand_and_sent_feedback_says_thanks(axe_page, daphne_server):
    page = axe_page
    short_policy(daphne_server)
    open_chat(page, daphne_server)
    ask(page, "Say hello.")
    answer = page.locator(".message.assistant").last
    timing = answer.get_by_role("button", name="Timing details")
    metrics = answer.locator(".metrics")
    expect(timing).to_be_visible()
    expect(timing).to_have_attribute("aria-expanded", "false")
    expect(metrics).to_be_hidden()
    timing.click()
    expect(metrics).to_be_visible()
    expect(metrics).to_contain_text("first character")
    expect(timing).to_have_attribute("aria-expanded", "true")
    assert serious_violations(page) == []
    timing.click()
    expect(metrics).to_be_hidden()

    answer.get_by_role("button", name="Good answer").click()
    comment = answer.get_by_label("What was good or wrong? (optional)")
    comment.fill("Short and kind.")
    answer.get_by_role("button", name="Send feedback").click()
    thanks = answer.locator(".feedback-thanks")
    expect(thanks).to_be_visible()
    expect(thanks).to_have_text("Thanks — your feedback was sent")
    expect(comment).to_be_hidden()
    expect(page.locator("#announcer")).to_have_text("Thanks — your feedback was sent")
    assert serious_violations(page) == []
    # Taking the rating back takes the thanks away; a new rating opens the form again.
    answer.get_by_role("button", name="Good answer").click()
    expect(thanks).to_be_hidden()
    answer.get_by_role("button", name="Bad answer").click()
    expect(comment).to_be_visible()
    expect(thanks).to_be_hidden()

    page.reload()
    answer = page.locator(".message.assistant").last
    expect(answer.locator(".metrics")).to_be_hidden()
    answer.get_by_role("button", name="Timing details").click()
    expect(answer.locator(".metrics")).to_contain_text("tokens")
    expect(answer.locator(".metrics")).to_be_visible()


def box(page, selector):
    return page.locator(selector).first.bounding_box()


def test_on_a_phone_the_title_bar_keeps_the_model_name_and_covers_no_message(
    browser, daphne_server
):
    short_policy(daphne_server)
    context = axe_context(browser, is_mobile=True)
    page = context.new_page()
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        sign_up(page, daphne_server)  # a signed-in account's links share the bar
        open_chat(page, daphne_server)
        for prompt in ("Tell me about owls.", "Tell me about cats.", "Tell me about dogs."):
            ask(page, prompt)
        page.reload()
        expect(page.locator(".message.assistant")).to_have_count(3)
        page.evaluate("document.querySelector('#messages').scrollTop = 0")
        name = page.locator(".model-name")
        assert name.evaluate("e => e.scrollWidth <= e.clientWidth"), name.inner_text()
        top, tools = box(page, ".topbar"), box(page, "#conversation-tools")
        first, messages = box(page, ".message"), box(page, "#messages")
        assert top["y"] + top["height"] <= tools["y"]
        assert tools["y"] + tools["height"] <= messages["y"] <= first["y"]
        # What lies at the first message's top left corner is the message itself: measured and
        # hit in one turn of the page's script, so a late layout change cannot fall between.
        covering = page.evaluate(
            """() => {
                const first = document.querySelector('.message');
                const corner = first.getBoundingClientRect();
                const at = document.elementFromPoint(corner.x + 4, corner.y + 4);
                return at && at.closest('.message') === first ? '' : (at ? at.outerHTML : 'nothing');
            }"""
        )
        assert not covering, covering[:300]
        for link in page.locator(".account a:visible, .account button:visible").all():
            b = link.bounding_box()
            assert b and b["x"] >= 0 and b["x"] + b["width"] <= 390, link.inner_text()
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert serious_violations(page) == []
    finally:
        context.close()
