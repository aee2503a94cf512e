"""The prefix-reuse and coalescing rows (prefix_reuse.py) as the benchmark's report lines, and
checked against their targets."""

from __future__ import annotations

TARGETS = {"follow_up": 1.5, "identical": 1.2, "rss_mb": 1.5 * 1024}


def report(results: dict) -> list[str]:
    """The rows as lines for the benchmark's report."""
    lines = ["Prefix KV reuse and in-flight coalescing (in process, model's first token)"]
    a = results.get("follow_up")
    if a:
        lines += [
            f"  (a) fresh one-line prompt, new conversation: first token {a.fresh_s * 1000:.0f} ms",
            f"      follow-up, {a.history_tokens} prompt tokens, history reused: first token "
            f"{a.follow_up_s * 1000:.0f} ms ({a.ratio:.2f}x the fresh one; {a.reused} tokens "
            f"reused, {a.computed} computed)",
            f"      the same follow-up with the store off: {a.without_reuse_s * 1000:.0f} ms "
            f"({a.without_reuse_s / a.fresh_s:.1f}x)",
        ]
    b = results.get("shared_policy")
    if b:
        lines.append(
            f"  (b) {b.users} users, same policy ({b.shared_tokens} shared opening tokens): "
            f"{b.computed} of {b.prompt_tokens} prompt tokens computed ({b.once} with the opening "
            f"computed once, {b.alignment} of them re-fed in padding columns); {b.reused} reused, "
            f"counting the shared prefill's own reuse"
        )
    c = results.get("identical")
    if c:
        lines.append(
            f"  (c) {c.users} identical prompts x {c.tokens} tokens: {c.generations} generation(s), "
            f"{c.complete}/{c.users} complete answers, {c.together_s:.2f} s vs {c.one_s:.2f} s "
            f"for one ({c.ratio:.2f}x)"
        )
    c = results.get("identical_across")
    if c:
        lines.append(
            f"      the same split between {c.processes} processes' coalescing on one Redis (one "
            f"engine): {c.generations} generation(s), {c.complete}/{c.users} complete answers, "
            f"{c.together_s:.2f} s vs {c.one_s:.2f} s for one ({c.ratio:.2f}x)"
        )
    d = results.get("budget")
    if d:
        lines.append(
            f"  (d) store offered {d.stored_tokens} tokens of KV: holds {d.held_bytes / 2**20:.0f} "
            f"of {d.budget_bytes / 2**20:.0f} MB in {d.entries} entries ({d.evictions} evicted); "
            f"process RSS {d.rss_mb / 1024:.2f} GB, peak {d.peak_rss_mb / 1024:.2f} GB"
        )
    return lines


def targets(results: dict) -> list[tuple[str, str, str, bool | None]]:
    """(figure, measured, target, met) for the benchmark's target table."""
    rows = []
    a, b, c, d = (results.get(k) for k in ("follow_up", "shared_policy", "identical", "budget"))
    rows.append(
        (
            "follow-up first token vs a fresh prompt",
            f"{a.ratio:.2f}x ({a.history_tokens} tokens)" if a else "-",
            f"<= {TARGETS['follow_up']:.1f}x",
            a.ratio <= TARGETS["follow_up"] if a else None,
        )
    )
    rows.append(
        (
            "8 users, one policy: prompt tokens computed",
            f"{b.computed} of {b.prompt_tokens} (opening once: {b.once})" if b else "-",
            "once",
            b.computed <= b.once if b else None,
        )
    )
    rows.append(
        (
            "8 identical prompts: wall vs one answer",
            f"{c.ratio:.2f}x, {c.generations} generation(s), {c.complete}/8 answers" if c else "-",
            f"<= {TARGETS['identical']:.1f}x",
            (c.ratio <= TARGETS["identical"] and c.generations == 1 and c.complete == c.users)
            if c
            else None,
        )
    )
    rows.append(
        (
            "prefix store within budget, RSS",
            f"{d.held_bytes / 2**20:.0f}/{d.budget_bytes / 2**20:.0f} MB, RSS "
            f"{d.rss_mb / 1024:.2f} GB (peak {d.peak_rss_mb / 1024:.2f})"
            if d
            else "-",
            "<= 1.5 GB",
            (d.held_bytes <= d.budget_bytes and d.rss_mb <= TARGETS["rss_mb"]) if d else None,
        )
    )
    return rows
