"""Highlighted code and math in answers, in Chromium under the page's own strict CSP, and with
axe-core: highlight.js colours a fence that names its language, KaTeX draws $...$, \\(...\\),
$$...$$ and \\[...\\], and a price's lone dollar stays text."""

import re

import pytest
from playwright.sync_api import expect

from tests.a11y import axe_context, serious_violations
from tests.test_browser import open_chat
from tests.test_browser_markdown import SCRIPTED_SOCKET

pytestmark = pytest.mark.browser

ANSWER = r"""Here is code:

```python
def area(r):
    return 3.14 * r ** 2  # a comment
```

```
no language: plain
```

Inline $E = mc^2$ and \(a^2 + b^2 = c^2\), and it costs $5 or $10 today.

$$
\frac{1}{2} + \sqrt{x}
$$

\[\sum_{i=1}^{n} i = \frac{n(n+1)}{2}\]

Bad TeX stays readable: $\frac{1$.
"""


def scripted_answer(page, server):
    page.add_init_script(SCRIPTED_SOCKET)
    open_chat(page, server)
    page.evaluate("(t) => { window.__script = t.match(/[\\s\\S]{1,6}/g); }", ANSWER)
    page.fill("#prompt", "Show me code and math")
    page.keyboard.press("Enter")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=20_000)
    return answer


def test_code_is_highlighted_and_math_drawn_under_the_strict_csp(page, daphne_server):
    refused = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security" in m.text else None)
    answer = scripted_answer(page, daphne_server)
    text = answer.locator(".text")
    python = text.locator("code.language-python")
    expect(python).to_have_class("language-python hljs")
    expect(python.locator(".hljs-keyword").first).to_have_text("def")
    expect(python.locator(".hljs-comment")).to_have_text("# a comment")
    keyword_colour = python.locator(".hljs-keyword").first.evaluate(
        "e => getComputedStyle(e).color"
    )
    assert keyword_colour != python.evaluate("e => getComputedStyle(e).color")
    expect(text.locator("pre code").nth(1).locator("span")).to_have_count(0)  # no language named
    assert python.inner_text() == "def area(r):\n    return 3.14 * r ** 2  # a comment\n"

    expect(text.locator(".math-inline .katex")).to_have_count(2)
    expect(text.locator(".math-display .katex-display")).to_have_count(2)
    expect(text.locator(".katex-html .mfrac")).to_have_count(2)
    expect(text.locator(".math-error")).to_have_text(r"\frac{1")
    expect(text.locator(".math-error")).to_have_attribute("title", re.compile("KaTeX parse error"))
    expect(text.locator("p", has_text="costs")).to_contain_text("it costs $5 or $10 today.")
    # Read aloud as MathML; drawn with KaTeX's fonts, and its CSSOM sizes were applied.
    expect(text.locator(".katex-mathml math").first).to_be_attached()
    # A fraction over a square root is two lines tall: KaTeX's sizes applied (about 25 px without).
    assert text.locator(".math-display").first.bounding_box()["height"] > 40
    font = text.locator(".katex .mathnormal").first.evaluate("e => getComputedStyle(e).fontFamily")
    assert "KaTeX_Math" in font
    assert refused == []
    # Copy keeps the Markdown source, math and all.
    assert answer.evaluate("a => a.chatAnswer.text") == ANSWER


def test_code_and_math_have_no_serious_accessibility_violation(browser, daphne_server):
    context = axe_context(browser)
    try:
        page = context.new_page()
        scripted_answer(page, daphne_server)
        expect(page.locator(".katex").first).to_be_visible()
        assert serious_violations(page) == []
    finally:
        context.close()
