"""axe-core (npm, node_modules/axe-core) run on a page in Chromium: its serious and critical
violations. The script is injected with Playwright's add_script_tag, which the chat's strict
CSP refuses, so the page must come from a context made with `axe_context` (bypass_csp)."""

from __future__ import annotations

from pathlib import Path

AXE = Path(__file__).resolve().parent.parent / "node_modules" / "axe-core" / "axe.min.js"
FAILING = ("serious", "critical")


def axe_context(browser, **options):
    """A browser context whose pages accept the injected axe-core script."""
    return browser.new_context(bypass_csp=True, viewport={"width": 1100, "height": 760}, **options)


def serious_violations(page) -> list[dict]:
    """axe-core's serious and critical violations on the page as it is now (id, help, nodes)."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.add_script_tag(path=str(AXE))
    violations = page.evaluate(
        """async () => (await axe.run(document, {resultTypes: ['violations']})).violations
            .map((v) => ({id: v.id, impact: v.impact, help: v.help,
                          nodes: v.nodes.slice(0, 5).map((n) => n.target.join(' '))}))"""
    )
    return [v for v in violations if v["impact"] in FAILING]
