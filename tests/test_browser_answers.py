"""Per-answer actions in a real browser with the real model: Regenerate, Edit and resend, Esc,
and a failed answer's explanation."""

import pytest
from playwright.sync_api import expect

from tests.test_browser import open_chat

pytestmark = pytest.mark.browser

PROMPT = "Count from 1 to 10, separated by commas."


def short_policy(server) -> None:
    server.policy("short", name="Short", mode="stream", max_new_tokens=12)


def test_regenerate_and_edit_add_versions_and_survive_a_reload(page, daphne_server):
    """Regenerate adds a version of the answer, Edit a version of the prompt: the thread shows one
    of each, with "‹ 2/2 ›", and keeps the old ones a switch away; a reload shows the same."""
    short_policy(daphne_server)
    open_chat(page, daphne_server)
    page.select_option("#policy", "short")
    page.fill("#prompt", PROMPT)
    page.keyboard.press("Enter")
    answers = page.locator(".message.assistant")
    expect(answers.last).to_have_attribute("data-state", "done", timeout=60_000)
    expect(page.locator(".versions")).to_have_count(0)

    answers.last.locator("button.regenerate").click()
    expect(answers).to_have_count(1)  # the new version in place of the old one
    expect(answers.last).to_have_attribute("data-state", "done", timeout=60_000)
    expect(answers.last.locator(".version-position")).to_have_text("Version 2/2")
    expect(page.locator(".message.user")).to_have_count(1)

    page.locator(".message.user").last.locator("button.edit-prompt").click()
    expect(page.locator("#prompt")).to_have_value(PROMPT)
    expect(page.locator("#edit-hint")).to_be_visible()
    page.fill("#prompt", "Count from 5 to 9.")
    page.keyboard.press("Enter")
    expect(answers).to_have_count(1)
    expect(answers.last).to_have_attribute("data-state", "done", timeout=60_000)
    expect(page.locator("#edit-hint")).to_be_hidden()
    asked = page.locator(".message.user")
    expect(asked).to_have_count(1)
    expect(asked.locator(".version-position")).to_have_text("Version 2/2")

    page.reload()
    expect(page.locator(".message.assistant")).to_have_count(1, timeout=10_000)
    expect(page.locator(".message.user .text")).to_have_text("Count from 5 to 9.")
    expect(page.locator(".message.user .version-position")).to_have_text("Version 2/2")
    expect(page.locator(".message.assistant .versions")).to_have_count(0)  # its only answer
    expect(page.locator("button.regenerate:visible")).to_have_count(1)
    page.locator(".message.user button.version-prev").click()
    expect(page.locator(".message.user .text")).to_have_text(PROMPT)
    expect(page.locator(".message.assistant .version-position")).to_have_text("Version 2/2")


def test_escape_stops_the_running_answer(page, daphne_server):
    """Esc anywhere on the page stops a streaming answer, like the Stop button."""
    open_chat(page, daphne_server)
    page.fill("#prompt", "Write a very long story about a dragon who learns to bake bread.")
    page.keyboard.press("Enter")
    answer = page.locator(".message.assistant").last
    expect(answer.locator(".text")).not_to_be_empty(timeout=30_000)
    page.keyboard.press("Escape")
    expect(answer).to_have_attribute("data-state", "cancelled", timeout=10_000)


def test_continue_writes_the_rest_of_a_cut_off_answer_into_the_same_bubble(page, daphne_server):
    """An answer cut off at the token limit offers Continue; the rest streams into the same
    answer, which stays one answer after a reload."""
    daphne_server.policy("tiny", mode="stream", max_new_tokens=4)
    open_chat(page, daphne_server)
    page.select_option("#policy", "tiny")
    page.fill("#prompt", "Write a long story about a fox in a forest.")
    page.keyboard.press("Enter")
    answers = page.locator(".message.assistant")
    expect(answers.last).to_have_attribute("data-state", "done", timeout=60_000)
    expect(answers.last.locator(".badge")).to_have_text("Cut off (token limit)")
    first = answers.last.locator(".text").inner_text()
    more = answers.last.locator("button.continue-answer")
    expect(more).to_be_visible()

    more.click()
    expect(answers).to_have_count(1)
    expect(answers.last).to_have_attribute("data-state", "done", timeout=60_000)
    longer = answers.last.locator(".text").inner_text()
    assert longer.startswith(first.rstrip()) and len(longer) > len(first)

    page.reload()
    expect(page.locator(".message.assistant")).to_have_count(1, timeout=10_000)
    expect(page.locator(".message.assistant .text")).to_have_text(longer)


def test_a_cut_answer_shows_its_good_part_and_says_why(page, daphne_server):
    """A hook that cuts the answer: the page replaces what streamed with the kept part and
    labels it, instead of withdrawing the answer."""
    daphne_server.policy(
        "brief",
        mode="stream",
        max_new_tokens=64,
        moderation_hooks=[{"hook": "repetition", "settings": {"max_chars": 60}}],
    )
    open_chat(page, daphne_server)
    page.select_option("#policy", "brief")
    page.fill("#prompt", "Write a long story about a fox in a forest.")
    page.keyboard.press("Enter")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
    expect(answer.locator(".badge")).to_contain_text("Cut short")
    text = answer.locator(".text").inner_text()
    assert 0 < len(text) <= 60
    expect(answer).not_to_have_class("withdrawn")


def test_a_failed_json_answer_explains_itself_and_still_does_after_a_reload(browser, daphne_server):
    """Three tokens cannot hold the cat the schema asks for: the answer fails whatever the model
    writes, and says why, what the policy expects and what the model wrote (which Copy copies);
    a reload shows the same; Try again asks once more; the picker speaks the policy's words."""
    from tests.a11y import axe_context, serious_violations

    daphne_server.policy(
        "cat",
        name="Cat card",
        description="Facts about a cat, as JSON a program can read",
        mode="buffer",
        json_schema={
            "title": "A cat with its name and microchip number",
            "type": "object",
            "properties": {"name": {"type": "string"}, "chip": {"type": "integer"}},
            "required": ["name", "chip"],
        },
        system_prompt='Reply only with JSON like {"name": "...", "chip": 1}.',
        max_new_tokens=3,
        max_retries=0,
    )
    context = axe_context(browser)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=daphne_server.url)
    page = context.new_page()
    try:
        open_chat(page, daphne_server)
        option = page.locator("#policy option[value='cat']")
        expect(option).to_have_text("Cat card: Facts about a cat, as JSON a program can read")
        expect(page.locator("#policy")).not_to_contain_text("(buffer)")
        page.select_option("#policy", "cat")
        page.fill("#prompt", "Describe a cat as JSON.")
        page.keyboard.press("Enter")
        answer = page.locator(".message.assistant").last
        expect(answer).to_have_attribute("data-state", "invalid", timeout=60_000)
        explained = answer.locator(".explanation")
        expect(explained).to_be_visible()
        expect(explained.locator(".explanation-expected")).to_have_text(
            "Expected: Facts about a cat, as JSON a program can read. "
            "A cat with its name and microchip number."
        )
        expect(explained.locator(".explanation-detail")).to_contain_text("Why: ")
        raw = explained.locator(".explanation-raw").text_content()
        assert raw and raw.strip()
        answer.locator("button.copy-answer").click()
        assert page.evaluate("navigator.clipboard.readText()") == raw
        assert serious_violations(page) == []

        page.reload()
        answer = page.locator(".message.assistant").last
        expect(answer).to_have_attribute("data-state", "invalid", timeout=10_000)
        expect(answer.locator(".explanation-raw")).to_have_text(raw)
        expect(answer.locator(".explanation-expected")).to_contain_text("microchip number")
        retry = answer.locator("button.regenerate")
        expect(retry).to_have_text("Try again")
        assert serious_violations(page) == []

        retry.click()
        answers = page.locator(".message.assistant")
        expect(answers).to_have_count(1)  # a new version in place of the failed one
        expect(answers.last).to_have_attribute("data-state", "invalid", timeout=60_000)
        expect(answers.last.locator(".explanation")).to_be_visible()
        expect(answers.last.locator(".version-position")).to_have_text("Version 2/2")
    finally:
        context.close()


def test_a_pasted_document_shows_its_reading_then_an_answer(page, daphne_server):
    """A 20,000-character paste is sent whole; while the model reads it the answer says how far
    ("Reading your message… N%"), then the answer streams in the same bubble."""
    from tests.test_documents import ask

    short_policy(daphne_server)
    open_chat(page, daphne_server)
    page.select_option("#policy", "short")
    page.fill("#prompt", ask("What colour was the harbour light painted?"))
    page.keyboard.press("Enter")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-state", "reading", timeout=30_000)
    expect(answer.locator(".queue")).to_contain_text("Reading your message…")
    expect(answer).to_have_attribute("data-state", "done", timeout=180_000)
    expect(answer.locator(".queue")).to_be_hidden()
    expect(answer.locator(".text")).not_to_be_empty()
    expect(page.locator(".message.user .text")).to_contain_text("harbour light of Varnholm")
