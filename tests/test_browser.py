"""The chat page in a real browser against a live daphne."""

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser

SCREENSHOT_DIR = Path(
    os.environ.get("SCREENSHOT_DIR", Path(__file__).resolve().parent.parent / "var" / "screenshots")
)


def open_chat(page, server):
    page.goto(server.url + "/")
    expect(page.locator("#health-banner")).to_be_hidden(timeout=60_000)
    expect(page.locator("#connection")).to_have_attribute("data-state", "open")


def test_typing_a_prompt_streams_text_and_stop_marks_it_stopped(page, daphne_server):
    """Type, see the answer grow chunk by chunk, press Stop, see it marked stopped."""
    open_chat(page, daphne_server)
    page.fill("#prompt", "Write a very long story about a dragon who learns to bake bread.")
    page.click("#send")
    answer = page.locator(".message.assistant").last
    text = answer.locator(".text")
    expect(text).not_to_be_empty(timeout=30_000)
    first_length = len(text.inner_text())
    page.wait_for_function(
        "([el, n]) => el.textContent.length > n + 20",
        arg=[text.element_handle(), first_length],
        timeout=30_000,
    )
    expect(page.locator("#stop")).to_be_visible()
    page.click("#stop")
    expect(answer).to_have_attribute("data-state", "cancelled", timeout=10_000)
    expect(answer.locator(".badge")).to_contain_text("Stopped")
    expect(answer.locator(".metrics")).to_contain_text("first character")
    expect(page.locator("#stop")).to_be_hidden()
    expect(page.locator("#send")).to_be_enabled()
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT_DIR / "chat-stopped.png"))


def test_a_finished_answer_shows_its_timings_and_survives_a_reload(page, daphne_server):
    """A complete answer is marked done with first/last character times, and is in the history after reload."""
    open_chat(page, daphne_server)
    page.fill("#prompt", "Count from 1 to 10, separated by commas.")
    page.keyboard.press("Enter")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
    expect(answer.locator(".text")).not_to_be_empty()
    text = answer.locator(".text").inner_text()  # whatever the model said, the reload shows again
    expect(answer.locator(".metrics")).to_contain_text("last")
    expect(page.locator("#conversations a")).not_to_have_count(0)
    assert "?c=" in page.url
    page.reload()
    expect(page.locator(".message.assistant .text").last).to_have_text(text, timeout=10_000)
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT_DIR / "chat-done.png"))


RECORD_STATES = """
() => {
  window.__states = [];
  new MutationObserver((mutations) => {
    for (const m of mutations) {
      if (m.attributeName === 'data-state' && m.target.classList.contains('assistant')) {
        window.__states.push(m.target.dataset.state);
      }
    }
  }).observe(document.getElementById('messages'), {attributes: true, subtree: true, attributeFilter: ['data-state']});
}
"""


def test_a_structured_answer_is_shown_as_validating_then_as_pretty_json(page, daphne_server):
    """Choosing the json policy: the answer shows "validating", then its JSON pretty-printed."""
    open_chat(page, daphne_server)
    page.evaluate(RECORD_STATES)  # every state the answer passes through, however brief
    page.select_option("#policy", "json")
    page.fill("#prompt", "What is the capital of France?")
    page.click("#send")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
    states = page.evaluate("window.__states")
    assert "validating" in states and states.index("validating") < states.index("done"), states
    assert "streaming" not in states[states.index("validating") :], (
        states
    )  # no chunk after holding began
    expect(answer.locator("pre.json")).to_contain_text('"answer": ')
    # Shown once: the pretty JSON with its mark, not the raw text beside it.
    expect(answer.locator(".text")).to_be_hidden()
    expect(answer.locator(".json-valid")).to_have_text("✓ Valid against the schema")
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT_DIR / "chat-json.png"))


def test_a_withdrawn_answer_is_replaced_by_a_notice(page, daphne_server):
    """A stream policy whose blocklist term appears: the shown text is replaced by a notice."""
    daphne_server.policy(
        "clean", name="Clean", mode="stream", blocklist_terms="12", max_new_tokens=200
    )
    open_chat(page, daphne_server)
    page.select_option("#policy", "clean")
    page.fill("#prompt", "Count from 1 to 50, separated by commas.")
    page.click("#send")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-state", "retracted", timeout=60_000)
    expect(answer.locator(".text")).to_contain_text("Answer withdrawn")
    expect(answer.locator(".text")).not_to_contain_text("11")


def test_html_in_prompts_and_answers_renders_as_text(page, daphne_server):
    """Markup typed by a user or echoed by the model is shown literally and never runs."""
    payload = '<img src=x onerror="window.__pwned=1"><b>bold</b><script>window.__pwned=2</script>'
    open_chat(page, daphne_server)
    page.fill("#prompt", f"Repeat exactly: {payload}")
    page.click("#send")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
    expect(page.locator(".message.user").last.locator(".text")).to_contain_text(payload)
    assert page.locator("#messages img, #messages b, #messages script").count() == 0
    assert page.evaluate("window.__pwned") is None
