"""An answer survives the page: a reload, the network gone for 5 s, a closed tab (which stops it
after the grace period) and a killed server, in Chromium against a live daphne, with the real
model and Redis."""

import json
import re
import time

import pytest
from playwright.sync_api import expect
from websockets.sync.client import connect

from harness.liveserver import LiveServer
from tests.a11y import serious_violations
from tests.conftest import LIVE_CACHE_URL
from tests.test_browser import open_chat

pytestmark = pytest.mark.browser

PROMPT = "Write a short story about a lighthouse keeper and a storm."
LONG = "Write a very long story about a dragon who learns to bake bread."
# Greedy and uncached: a second asking generates again, so the two answers can be compared.
# 240 tokens, about 2 s at this machine's speed: a reload right after the first text lands
# mid-answer.
POLICY = {"name": "Resume", "mode": "stream", "max_new_tokens": 240, "cache_enabled": False}


def raw_text(answer) -> str:
    """The answer's text as the page holds it (Markdown source, not the rendered words)."""
    return answer.evaluate("(node) => node.chatAnswer.text")


def metric(server, name: str) -> float:
    body = server.metrics()  # with the live server's bearer token, as Prometheus scrapes
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", body, re.M))


@pytest.fixture(scope="module")
def reference(daphne_server):
    """What a client that never left gets for PROMPT under the policy: asked over a socket."""
    daphne_server.policy("resume", **POLICY)

    # The sync client: Playwright's sync API keeps an event loop running in this thread.
    with connect(daphne_server.ws_url, origin=daphne_server.url) as ws:
        frame = {"type": "prompt", "request_id": "ref", "text": PROMPT, "policy": "resume"}
        ws.send(json.dumps(frame))
        while (done := json.loads(ws.recv(timeout=120)))["type"] != "done":
            pass
    assert done["finish_reason"] in ("eos", "length") and done["text"]
    return done


def ask(page, server, text: str, policy: str):
    open_chat(page, server)
    page.select_option("#policy", policy)
    page.fill("#prompt", text)
    page.click("#send")
    answer = page.locator(".message.assistant").last
    expect(answer.locator(".text")).not_to_be_empty(timeout=60_000)
    return answer


def test_a_reload_mid_answer_goes_on_streaming_into_the_same_bubble(
    axe_page, daphne_server, reference
):
    """Reload while the answer streams: the same message shows the text so far at once and
    streams the rest; the server counts a resume; the final text is exactly what a client that
    never reloaded got for the same greedy prompt, and axe-core finds nothing serious."""
    page = axe_page
    resumed = metric(daphne_server, "chat_answers_resumed_total")
    answer = ask(page, daphne_server, PROMPT, "resume")
    message = answer.evaluate("(node) => node.chatAnswer.messageId")
    expect(answer).to_have_attribute("data-state", "streaming")
    page.reload()
    answer = page.locator(f'.message.assistant[data-message-id="{message}"]')
    expect(answer).to_have_count(1, timeout=10_000)
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
    assert metric(daphne_server, "chat_answers_resumed_total") == resumed + 1
    assert raw_text(answer) == reference["text"]
    assert answer.evaluate("(node) => node.chatAnswer.finishReason") in ("eos", "length")
    expect(page.locator(".message.assistant")).to_have_count(1)
    expect(answer.locator(".status")).to_be_hidden()
    assert serious_violations(page) == []


def test_five_seconds_offline_mid_answer_then_the_answer_resumes(page, daphne_server, reference):
    """The network goes away for 5 s while the answer streams: the page says it is offline,
    reconnects when the network is back and resumes; the text ends exactly as a client that
    never lost the network got it, nothing lost and nothing twice."""
    answer = ask(page, daphne_server, PROMPT, "resume")
    page.context.set_offline(True)
    expect(page.locator("#connection")).to_have_attribute("data-state", "offline")
    expect(page.locator("#connection-label")).to_contain_text("offline")
    page.wait_for_timeout(5_000)
    page.context.set_offline(False)
    expect(page.locator("#connection")).to_have_attribute("data-state", "open", timeout=10_000)
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
    assert raw_text(answer) == reference["text"]


def test_a_closed_tab_stops_its_answer_after_the_grace_period(browser, short_grace_server):
    """Close the tab while a long answer streams: the answer goes on through the grace period
    (CHAT_TIMEOUTS resume), then stops within a decode step and is stored cancelled, reason
    no_listener."""
    daphne_server, grace = short_grace_server
    # Long enough to outlast the grace period (eos aside, about 400 tokens: 4 s at 100 tok/s).
    daphne_server.policy(
        "linger", name="Linger", mode="stream", max_new_tokens=1024, cache_enabled=False
    )
    context = browser.new_context()
    page = context.new_page()
    ask(page, daphne_server, LONG, "linger")
    conversation = re.search(r"\?c=(\d+)", page.url).group(1)
    page.close()
    closed = time.monotonic()

    def answer() -> dict:
        body = context.request.get(f"{daphne_server.url}/api/conversations/{conversation}/")
        return body.json()["messages"][-1]

    page_gone_s = grace - 1.0
    while time.monotonic() - closed < page_gone_s:
        time.sleep(0.25)
    assert answer()["status"] == "streaming"  # still generating, for a page that may come back
    while (last := answer())["status"] == "streaming":
        assert time.monotonic() - closed < grace + 10, "the answer never stopped"
        time.sleep(0.05)
    stopped = time.monotonic() - closed
    context.close()
    assert last["status"] == "cancelled"
    assert stopped <= grace + 1.0, stopped  # one decode step, the store and this poll


@pytest.fixture
def short_grace_server(tmp_path):
    """A daphne whose grace period (3 s) a long answer outlasts however fast this machine
    decodes (the default 10 s is about 1,000 tokens here, the most an answer may have)."""
    server = LiveServer(tmp_path, CHAT_CACHE_REDIS_URL=LIVE_CACHE_URL, CHAT_TIMEOUTS="resume=3")
    yield server.start(), 3.0
    server.stop()


@pytest.fixture
def own_server(tmp_path):
    """A daphne of this test's own: killing the shared one would disturb other tests."""
    server = LiveServer(tmp_path, CHAT_CACHE_REDIS_URL=LIVE_CACHE_URL).start()
    yield server
    server.stop()


def test_a_killed_server_keeps_what_was_streamed_and_continue_finishes_it(page, own_server):
    """SIGKILL the daphne mid-answer and start it again: the page reconnects and shows the
    answer interrupted, with at least the text it showed more than 1 s before the kill, and
    Continue; Continue writes the rest into the same answer."""
    server = own_server
    # Room for several seconds of answer at this machine's speed (over 100 tok/s on 2 cores):
    # the kill comes 1.5 s after the first text, while it still streams.
    server.policy("kill", name="Kill", mode="stream", max_new_tokens=400, cache_enabled=False)
    answer = ask(page, server, LONG, "kill")
    shown = []  # (when, the text shown then)
    first = None
    while first is None or time.monotonic() - first < 1.5:
        text = raw_text(answer)
        if text and first is None:
            first = time.monotonic()
        shown.append((time.monotonic(), text))
        page.wait_for_timeout(100)
    assert answer.get_attribute("data-state") == "streaming", "the answer ended before the kill"
    server.process.kill()
    killed = time.monotonic()
    server.process.wait()
    early = [text for at, text in shown if at <= killed - 1.0][-1]
    assert early
    expect(page.locator("#connection")).not_to_have_attribute("data-state", "open")

    server.start()  # migrates first: the sweep marks the answer interrupted
    expect(answer).to_have_attribute("data-state", "interrupted", timeout=60_000)
    kept = raw_text(answer)
    assert kept.startswith(early), (early, kept)
    expect(answer.locator(".badge")).to_have_text("Interrupted")
    more = answer.locator("button.continue-answer")
    expect(more).to_be_visible()
    expect(page.locator("#send")).to_be_enabled(timeout=30_000)
    more.click()
    expect(answer).to_have_attribute("data-state", "done", timeout=90_000)
    final = raw_text(answer)
    assert final.startswith(kept) and len(final) > len(kept)
    assert answer.evaluate("(node) => node.chatAnswer.finishReason") in ("eos", "length")
