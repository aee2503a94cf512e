"""Chunks received vs Markdown renders vs frames painted, for a long answer in a real browser.

    .venv/bin/python bench/scripts/render_rate.py [--tokens 1000]

Starts a LiveServer (the real model, a throwaway SQLite database), stores a stream policy
with max_new_tokens=N, opens the page in Debian's Chromium, asks for a long story and
counts, in the page: chunk events received, Markdown renders (at most one per animation
frame by design), and animation frames painted while the answer streamed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from testing.liveserver import LiveServer  # noqa: E402

COUNT_FRAMES = """() => {
  window.__frames = 0;
  const tick = () => { window.__frames += 1; requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        server = LiveServer(Path(folder)).start()
        try:
            server.manage(
                "shell",
                "-c",
                "from chat.models import OutputPolicy as P; P.objects.create(slug='long', "
                f"name='Long', mode='stream', max_new_tokens={args.tokens}, cache_enabled=False)",
            )
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"]
                )
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(server.url + "/")
                expect(page.locator("#health-banner")).to_be_hidden(timeout=120_000)
                expect(page.locator("#connection")).to_have_attribute("data-state", "open")
                page.evaluate(COUNT_FRAMES)
                page.select_option("#policy", "long")
                page.fill(
                    "#prompt",
                    "Write a very long story about a dragon who learns to bake bread, "
                    "with headings, lists and a recipe in a code block.",
                )
                before = page.evaluate("[window.__frames, window.__chatRenderStats.renders]")
                page.click("#send")
                answer = page.locator(".message.assistant").last
                ended = re.compile("done|cancelled|invalid|retracted|error")
                expect(answer).to_have_attribute("data-state", ended, timeout=1_800_000)
                frames = page.evaluate("window.__frames") - before[0]
                stats = page.evaluate("window.__chatRenderStats")
                tokens = answer.locator(".metrics").inner_text()
                browser.close()
        finally:
            server.stop()
    renders = stats["renders"] - before[1]
    print(f"answer: {tokens}")
    print(
        f"chunks received {stats['chunks']}, Markdown renders {renders}, "
        f"frames painted while streaming {frames}"
    )
    print(f"renders per chunk {renders / max(stats['chunks'], 1):.2f}")


if __name__ == "__main__":
    main()
