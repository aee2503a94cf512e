"""The page shows and enforces what the server serves it (chat/pages/page_constants.py),
in Chromium: the served JSON is changed in the page before its modules read it, and the page follows."""

import json

import pytest
from playwright.sync_api import expect

from tests.test_browser import open_chat

pytestmark = pytest.mark.browser

# Merges a patch into the chat-constants tag as the parser inserts it (the modules run after
# parsing). Playwright injects it, so the page's CSP does not apply to it.
PATCH_SERVED = """
((patch) => {
  const merge = (target, source) => {
    for (const [key, value] of Object.entries(source)) {
      if (value && typeof value === 'object') merge(target[key], value);
      else target[key] = value;
    }
  };
  new MutationObserver((records, observer) => {
    const tag = document.getElementById('chat-constants');
    if (!tag || !tag.textContent) return;
    observer.disconnect();
    const constants = JSON.parse(tag.textContent);
    merge(constants, patch);
    tag.textContent = JSON.stringify(constants);
  }).observe(document, { childList: true, subtree: true });
})(%s);
"""


def serve_changed(page, patch: dict) -> None:
    page.add_init_script(PATCH_SERVED % json.dumps(patch))


def test_a_stopped_answer_wears_the_served_label(page, daphne_server):
    label = "Halted (the server's label)"
    serve_changed(page, {"finish": {"cancelled": {"badge": label}}})
    open_chat(page, daphne_server)
    page.fill("#prompt", "Write a very long story about a dragon who learns to bake bread.")
    page.click("#send")
    answer = page.locator(".message.assistant").last
    expect(answer.locator(".text")).not_to_be_empty(timeout=30_000)
    page.click("#stop")
    expect(answer).to_have_attribute("data-state", "cancelled", timeout=10_000)
    expect(answer.locator(".badge")).to_have_text(label)


def test_the_composer_enforces_the_served_prompt_limit(page, daphne_server):
    serve_changed(page, {"limits": {"maxPromptChars": 12}})
    open_chat(page, daphne_server)
    page.fill("#prompt", "twelve chars")
    expect(page.locator("#char-count")).to_have_text("12 / 12")
    expect(page.locator("#send")).to_be_enabled()
    page.fill("#prompt", "thirteen char")
    expect(page.locator("#char-count")).to_have_text("13 / 12")
    expect(page.locator("#send")).to_be_disabled()
