"""The page shows and enforces what the server serves it (chat/page_constants.py), in Chromium:
the served JSON is changed on its way to the browser, and the page follows the change."""

import json
import re

from playwright.sync_api import expect

from tests.test_browser import open_chat

CONSTANTS = re.compile(
    r'(<script id="chat-constants" type="application/json">)(.*?)(</script>)', re.S
)


def serve_changed(page, change):
    """Serve the real page with its chat-constants JSON passed through `change` first."""

    def handle(route):
        response = route.fetch()
        html = response.text()
        match = CONSTANTS.search(html)
        assert match, "no chat-constants in the page"
        constants = json.loads(match.group(2))
        change(constants)
        body = html[: match.start(2)] + json.dumps(constants) + html[match.end(2) :]
        route.fulfill(response=response, body=body)

    page.route(re.compile(r"/(\?.*)?$"), handle)


def test_a_stopped_answer_wears_the_served_label(page, daphne_server):
    label = "Halted (the server's label)"
    serve_changed(page, lambda c: c["finish"]["cancelled"].update(badge=label))
    open_chat(page, daphne_server)
    page.fill("#prompt", "Write a very long story about a dragon who learns to bake bread.")
    page.click("#send")
    answer = page.locator(".message.assistant").last
    expect(answer.locator(".text")).not_to_be_empty(timeout=30_000)
    page.click("#stop")
    expect(answer).to_have_attribute("data-state", "cancelled", timeout=10_000)
    expect(answer.locator(".badge")).to_have_text(label)


def test_the_composer_enforces_the_served_prompt_limit(page, daphne_server):
    serve_changed(page, lambda c: c["limits"].update(maxPromptChars=12))
    open_chat(page, daphne_server)
    page.fill("#prompt", "twelve chars")
    expect(page.locator("#char-count")).to_have_text("12 / 12")
    expect(page.locator("#send")).to_be_enabled()
    page.fill("#prompt", "thirteen char")
    expect(page.locator("#char-count")).to_have_text("13 / 12")
    expect(page.locator("#send")).to_be_disabled()
