"""Answers rendered as Markdown in a real browser: safe with hostile input, at most once a frame."""

import json

import pytest
from playwright.sync_api import expect

from tests.hostile_markdown import PAYLOADS
from tests.test_browser import open_chat

pytestmark = pytest.mark.browser

# A stand-in WebSocket for the page: answers each prompt with the chunks in
# window.__script, `window.__chunkGapMs` apart (0: as fast as the event loop goes).
SCRIPTED_SOCKET = """
(() => {
  window.__script = [];
  window.__chunkGapMs = 0;
  class ScriptedSocket extends EventTarget {
    static OPEN = 1;
    constructor(url) {
      super();
      this.readyState = 0;
      setTimeout(() => { this.readyState = 1; this.dispatchEvent(new Event('open')); }, 0);
    }
    emit(data) { this.dispatchEvent(new MessageEvent('message', { data: JSON.stringify(data) })); }
    send(raw) {
      const frame = JSON.parse(raw);
      if (frame.type !== 'prompt') return;
      const id = frame.request_id;
      const chunks = window.__script.slice();
      this.emit({ type: 'accepted', request_id: id, conversation: null, message: 1, queue_position: 0 });
      let i = 0;
      const next = () => {
        if (i < chunks.length) {
          this.emit({ type: 'chunk', request_id: id, text: chunks[i++] });
          setTimeout(next, window.__chunkGapMs);
          return;
        }
        this.emit({ type: 'done', request_id: id, message: 1, text: chunks.join(''), json: null,
                    finish_reason: 'eos', cached: false, metrics: { new_tokens: chunks.length } });
      };
      setTimeout(next, 0);
    }
    close() {}
  }
  window.WebSocket = ScriptedSocket;
})();
"""

WATCH = """
() => {
  window.__frames = 0;
  const tick = () => { window.__frames += 1; requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
}
"""


PAGE_PATHS = ("/?c=", "/static/", "/api/", "/ws/chat/")


class Watch:
    """Everything a hostile payload could do that a test can see."""

    def __init__(self, page, server):
        self.dialogs, self.foreign = [], []
        self.origin = server.url
        page.on("dialog", self._dialog)
        page.on("request", self._request)

    def _dialog(self, dialog):
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def _request(self, request):
        """Only the page's own requests: itself, its static files, its API and health."""
        url = request.url
        for origin in (self.origin, self.origin.replace("http", "ws", 1)):
            if url.startswith(origin):
                path = url[len(origin) :]
                if path in ("/", "/healthz") or path.startswith(PAGE_PATHS):
                    return
        self.foreign.append(url)

    def assert_inert(self, page):
        page.wait_for_timeout(300)  # let any onerror/onload that slipped through fire
        assert self.dialogs == []
        assert self.foreign == []
        assert page.evaluate("window.__pwned") is None
        dangerous = "script, iframe, img, svg, style, link, object, embed, form, input, meta, base, video, math, template, details"
        # The page's own comment form under each answer (static/chat/page/feedback.js) is the
        # one form allowed: it is built by the script, never from an answer's text.
        own = ":not(form.feedback-form)"
        # KaTeX's own drawing of math (MathML, and spans it sizes with CSSOM styles) is not the
        # answer's markup: markdown.js gives it the TeX as text and no trust.
        own += ":not(.katex *)"
        assert page.locator(f"#messages :is({dangerous}){own}").count() == 0
        assert page.locator("#messages .text form, #messages .text input").count() == 0
        hrefs = page.eval_on_selector_all("#messages a", "as => as.map(a => [a.href, a.rel])")
        for href, rel in hrefs:
            assert href.startswith(("http://", "https://", "mailto:")), href
            assert rel == "noopener noreferrer", (href, rel)
        assert page.locator("#messages [style]:not(th):not(td):not(.katex *)").count() == 0
        assert page.locator("#messages .katex a, #messages .katex [class~=x]").count() == 0
        assert page.locator("#messages").is_visible()


def seed_conversation(server, session_key: str, messages: list[tuple[str, str]], tmp_path) -> int:
    """A stored conversation of the browser's session, as if earlier answers had said these things."""
    data = tmp_path / "seed.json"
    data.write_text(json.dumps({"session": session_key, "messages": messages}))
    code = (
        "import json; from chat.models import Conversation, Message; "
        f"d = json.load(open({str(data)!r})); "
        "c = Conversation.objects.create(session_key=d['session'], title='Hostile'); "
        "[Message.objects.create(conversation=c, role=r, text=t) for r, t in d['messages']]; "
        "print(c.pk)"
    )
    return int(server.manage("shell", "-c", code).strip().splitlines()[-1])


def session_key(page) -> str:
    return next(c["value"] for c in page.context.cookies() if c["name"] == "sessionid")


def test_hostile_markdown_in_stored_prompts_and_answers_renders_inert(
    page, daphne_server, tmp_path
):
    """Every payload, as a stored prompt and as a stored answer rendered on reload, stays text."""
    assert len(PAYLOADS) >= 30
    watch = Watch(page, daphne_server)
    page.add_init_script("window.__pwned = undefined;")
    open_chat(page, daphne_server)
    messages = []
    for payload in PAYLOADS:
        messages += [("user", payload), ("assistant", f"Here it is:\n\n{payload}\n\nDone.")]
    conversation = seed_conversation(daphne_server, session_key(page), messages, tmp_path)
    page.goto(f"{daphne_server.url}/?c={conversation}")
    expect(page.locator(".message.assistant")).to_have_count(len(PAYLOADS), timeout=10_000)
    watch.assert_inert(page)
    # Prompts show exactly what was typed.
    expect(page.locator(".message.user .text").first).to_have_text(PAYLOADS[0])
    # The markup a payload carries is shown as text inside the answer.
    expect(page.locator(".message.assistant .text").first).to_contain_text("<script>")


def test_hostile_markdown_streamed_as_an_answer_and_typed_as_a_prompt_renders_inert(
    page, daphne_server
):
    """The same corpus arriving chunk by chunk (a scripted source) while the page re-renders."""
    watch = Watch(page, daphne_server)
    page.add_init_script(SCRIPTED_SOCKET)
    open_chat(page, daphne_server)
    text = "\n\n".join(PAYLOADS)
    # Cut into 7-character pieces, so tags and fences arrive split across chunks.
    page.evaluate("(t) => { window.__script = t.match(/[\\s\\S]{1,7}/g); }", text)
    page.fill("#prompt", "\n".join(PAYLOADS[:12]))
    page.click("#send")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=20_000)
    expect(page.locator(".message.user .text").last).to_have_text("\n".join(PAYLOADS[:12]))
    watch.assert_inert(page)


MARKDOWN = """# Title

Some **bold** and `inline code`, a [link](https://example.org/x) and [bad](javascript:alert(1)).

- one
- two

| name | value |
|:-----|------:|
| a    | 1     |

```python
print("hello")
```
"""


def test_markdown_renders_structure_links_and_code_blocks_with_copy(browser, daphne_server):
    """Headings, lists, tables, safe links, inline code; a fenced block shows its language and copies."""
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=daphne_server.url)
    page = context.new_page()
    try:
        page.add_init_script(SCRIPTED_SOCKET)
        open_chat(page, daphne_server)
        page.evaluate("(t) => { window.__script = t.match(/[\\s\\S]{1,5}/g); }", MARKDOWN)
        page.fill("#prompt", "Show me Markdown")
        page.keyboard.press("Enter")
        answer = page.locator(".message.assistant").last
        expect(answer).to_have_attribute("data-state", "done", timeout=20_000)
        text = answer.locator(".text")
        expect(text.locator("h1")).to_have_text("Title")
        expect(text.locator("li")).to_have_count(2)
        expect(text.locator("table td").last).to_have_text("1")
        expect(text.locator("p code")).to_have_text("inline code")
        link = text.locator("a", has_text="link")
        expect(link).to_have_attribute("href", "https://example.org/x")
        expect(link).to_have_attribute("rel", "noopener noreferrer")
        expect(text.locator("a", has_text="bad")).to_have_count(0)
        expect(answer.locator(".code-lang")).to_have_text("python")
        answer.locator("button.copy-code").click()
        expect(answer.locator("button.copy-code")).to_have_text("Copied")
        assert page.evaluate("navigator.clipboard.readText()") == 'print("hello")\n'
        answer.locator("button.copy-answer").click()
        assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN
    finally:
        context.close()


def test_a_thousand_chunks_are_rendered_at_most_once_per_frame(page, daphne_server):
    """1,000 chunks arriving faster than frames: far fewer renders than chunks, never more than frames."""
    page.add_init_script(SCRIPTED_SOCKET)
    open_chat(page, daphne_server)
    page.evaluate(WATCH)
    # A 1,000-token answer of prose, lists and code, as the tokenizer's pieces would come.
    page.evaluate(
        """() => {
          const words = [];
          for (let i = 0; i < 1000; i++) {
            words.push(i % 80 === 0 ? '\\n\\n## Part ' : i % 37 === 0 ? '\\n- item ' : ` word${i}`);
          }
          window.__script = words;
        }"""
    )
    page.fill("#prompt", "A long answer")
    frames_before = page.evaluate("window.__frames")
    page.click("#send")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=30_000)
    stats = page.evaluate("window.__chatRenderStats")
    frames = page.evaluate("window.__frames") - frames_before
    print(f"chunks received {stats['chunks']}, renders {stats['renders']}, frames {frames}")
    assert stats["chunks"] == 1000
    assert stats["renders"] <= frames + 2  # +2: the history-free page and the final render on done
    assert stats["renders"] < stats["chunks"]
    expect(answer.locator(".text h2")).to_have_count(13)
