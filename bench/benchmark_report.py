"""`manage.py benchmark`'s report: the measured figures as the lines docs/benchmarks.md quotes."""

import os

from django.conf import settings

from bench import benchmarking as bm
from bench import in_process, prefix_reuse_report
from bench.benchmark_live import CLOSED_TAB_GRACE_S
from chat.infra.stats import percentile


def ms(seconds):
    return None if seconds is None else seconds * 1000


class Report:
    """The report's lines, from the figures measured. Mixed into the command."""

    def report(self):
        out = self.stdout.write
        r = self.results
        floors = getattr(self, "floors", {})
        floor_n = floors.get(self.tokens)
        out("")
        out(
            f"== benchmark: SmolLM2 on {os.cpu_count()} CPUs, {r.get('threads', '?')} torch threads, "
            f"prompt of {r.get('prompt_tokens', '?')} tokens: {self.prompt!r}"
        )
        out(
            f"   1-min load average {r['load_start']:.1f} at start, {r['load_end']:.1f} at end"
            + (
                " (other work shares the CPUs: figures are noisier and slower than on an idle machine)"
                if max(r["load_start"], r["load_end"]) > 0.5 * (os.cpu_count() or 1)
                else ""
            )
        )
        out("")
        out(
            "Single answer (greedy, same model input everywhere; 'vs floor' = total / bare generate for the same tokens)"
        )
        out(
            f"  {'way':44} {'tokens':>6} {'1st chunk':>10} {'total':>9} {'ms/tok':>7} {'tok/s':>6} {'vs floor':>8}  finish"
        )

        def row(name, tokens, first_ms, total_s, finish):
            floor = floors.get(tokens)
            mspt = total_s * 1000 / tokens if tokens else None
            tps = tokens / total_s if total_s else None
            out(
                f"  {name:44} {tokens:>6} {bm.fmt(first_ms, '.0f', ' ms'):>10} {bm.fmt(total_s, '.2f', ' s'):>9} "
                f"{bm.fmt(mspt, '.1f'):>7} {bm.fmt(tps, '.1f'):>6} "
                f"{bm.fmt(bm.ratio(total_s, floor.total_s if floor else None), '.3f', 'x'):>8}  {finish}"
            )

        for tokens, timed in sorted(floors.items()):
            if timed:
                label = "1. bare model.generate (floor)" + (
                    "" if tokens == self.tokens else ", for an early end"
                )
                row(label, tokens, None, timed.total_s, "forced (min_new_tokens)")
        forced = r.get("engine_forced")
        if forced:
            row(
                "2a. engine streamed, length forced",
                forced.tokens,
                ms(forced.first_s),
                forced.total_s,
                f"forced ({forced.finish})"
                if forced.finish != "length"
                else "forced (min_new_tokens)",
            )
        else:
            out(
                f"  2a. engine streamed, length forced: {r.get('engine_forced_how') or 'not measured'}"
            )
        engine = r.get("engine")
        if engine:
            row(
                "2b. backend.generate + on_text (eos allowed)",
                engine.tokens,
                ms(engine.first_s),
                engine.total_s,
                engine.finish,
            )
        live = r.get("live")
        if live and live.ok:
            row(
                "3. WebSocket client via daphne",
                live.new_tokens,
                live.first_chunk_ms,
                live.done_ms / 1000,
                live.finish_reason,
            )
            m = live.metrics
            out(
                f"     server metrics: queue {m.get('queue_ms')} ms, model first token (ttft) {m.get('ttft_ms')} ms, "
                f"first visible {m.get('ttfv_ms')} ms, total {m.get('total_ms')} ms, {m.get('new_tokens')} tokens, "
                f"{live.chunks} chunks"
            )
            out(
                f"     client: connect {bm.fmt(live.connect_ms, '.1f')} ms, first event {bm.fmt(live.first_event_ms, '.1f')} ms, "
                f"first chunk {bm.fmt(live.first_chunk_ms, '.1f')} ms, done {bm.fmt(live.done_ms, '.1f')} ms"
            )
            if floor_n and live.new_tokens:
                out(
                    f"     per token: WebSocket {live.done_ms / live.new_tokens:.1f} ms vs floor "
                    f"{floor_n.ms_per_token:.1f} ms ({live.done_ms / live.new_tokens / floor_n.ms_per_token:.3f}x)"
                )
            self.closed_tab_report(out, r.get("closed_tab"))
        if r.get("engine_forced"):
            out(f"  2a forces the token count like 1, via {r.get('engine_forced_how')};")
        out(
            "  2b and 3 may end early at eos or the stop string: their floor is a bare run of the same token count."
        )

        newcomer = r.get("newcomer")
        if newcomer:
            x = bm.ratio(newcomer.busy_s, newcomer.alone_s)
            r["newcomer_x"] = x if newcomer.long_running else None
            out("")
            out(
                f"A newcomer ({in_process.NEWCOMER!r}) in the server's scheduler, first chunk from submit: "
                f"alone {bm.fmt(ms(newcomer.alone_s), '.0f', ' ms')}, while a "
                f"{self.newcomer_tokens}-token answer decodes {bm.fmt(ms(newcomer.busy_s), '.0f', ' ms')} "
                f"({bm.fmt(x, '.2f', 'x')}); the long answer "
                + (
                    f"was still running (cancelled after {newcomer.long_tokens} tokens)"
                    if newcomer.long_running
                    else "had already ended"
                )
            )

        hits = r.get("hits")
        out("")
        if hits:
            served = [a for a in hits if a.ok and a.cached]
            p50 = bm.median(a.done_ms for a in served)
            out(
                f"Cache hits ({r.get('hit_prompt')}): {len(served)}/{len(hits)} served cached, each on a new connection"
            )
            out(
                f"  prompt sent -> done: p50 {bm.fmt(p50, '.1f')} ms, p90 {bm.fmt(percentile([a.done_ms for a in served], 90), '.1f')} ms, "
                f"max {bm.fmt(max((a.done_ms for a in served), default=None), '.1f')} ms; "
                f"connect p50 {bm.fmt(bm.median(a.connect_ms for a in served), '.1f')} ms; "
                f"server total_ms p50 {bm.fmt(bm.median(a.metrics.get('total_ms') for a in served), '.1f')} ms"
            )
            r["cache_p50"] = p50 if len(served) == len(hits) else None
        else:
            out("Cache hits: not measured")

        conc = r.get("concurrency") or {}
        out("")
        out(
            f"Concurrent clients ({self.ctokens} max new tokens each, distinct prompts, one connection each; "
            "wall = first prompt sent -> last done)"
        )
        out(
            f"  {'server':24} {'users':>5} {'ok':>5} {'tokens':>6} {'wall':>7} {'agg tok/s':>9} {'user tok/s':>10} "
            f"{'worst ttft':>10} {'x 1 user':>8}"
        )
        for key in ("queue", "fp32", "batch"):
            if key not in conc:
                continue
            label, rows = conc[key]
            one = None
            for users, (answers, wall) in sorted(rows.items()):
                ok = [a for a in answers if a.ok]
                tokens = sum(a.new_tokens for a in ok)
                agg = tokens / wall if wall else None
                per_user = bm.median(a.new_tokens / (a.done_ms / 1000) for a in ok if a.done_ms)
                worst = max(
                    (a.ttft_client_ms for a in answers if a.ttft_client_ms is not None),
                    default=None,
                )
                if users == 1:
                    one = agg
                x = bm.ratio(agg, one)
                r.setdefault("scale", {})[(key, users)] = x if len(ok) == len(answers) else None
                r.setdefault("agg", {})[(key, users)] = (
                    (agg, worst) if len(ok) == len(answers) else None
                )
                out(
                    f"  {label:24} {users:>5} {len(ok):>2}/{len(answers):<2} {tokens:>6} {bm.fmt(wall, '.2f', ' s'):>7} "
                    f"{bm.fmt(agg, '.1f'):>9} {bm.fmt(per_user, '.1f'):>10} {bm.fmt(worst, '.0f', ' ms'):>10} "
                    f"{bm.fmt(x, '.2f', 'x'):>8}"
                )
                errors = sorted({a.error for a in answers if a.error})
                if errors:
                    out(f"    errors: {'; '.join(errors)}")
        out(
            "  user tok/s: median of a user's tokens / (their prompt sent -> their done), queueing included;"
        )
        out(
            "  worst ttft: slowest prompt sent -> first chunk at the client. Answers may end early at eos."
        )

        out("")
        out("Processes")
        for run in self.servers:
            out(
                f"  daphne {run.label:26} start->ready {bm.fmt(run.ready_s, '.2f', ' s'):>8}   "
                f"peak RSS (VmHWM) {bm.fmt(run.peak_rss_mb, '.0f', ' MB')}"
            )
        out(
            f"  benchmark process (model loaded) {'':25} peak RSS (ru_maxrss) {r['bench_rss_mb']:.0f} MB"
        )
        out(
            "  start->ready: LiveServer.start() -> /healthz 200, on an already migrated database (its no-op migrate included)"
        )

        self.api_report(out)
        prefix = ["", *prefix_reuse_report.report(r["prefix"])] if r.get("prefix") else []
        memory = ["", *self.memory_lines()] if r.get("memory") else []
        for line in [*self.head_to_head_lines(), *self.relay_lines(), *prefix, *memory]:
            out(line)
        self.targets(out, floors)
        out("")
        out(f"benchmark took {r['elapsed_s']:.0f} s")

    def closed_tab_report(self, out, closed) -> None:
        """The closed tab's line: measured with a short grace period, said for the default one."""
        if closed is None:
            return
        if closed.stopped_ms is None:
            out("     closed tab to model stopped: not seen within 60 s")
            return
        if closed.ended_first:
            out(
                f"     closed tab to model stopped: the answer ended on its own first, "
                f"{closed.stopped_ms:.0f} ms after the close"
            )
            return
        after_grace = closed.stopped_ms - CLOSED_TAB_GRACE_S * 1000
        out(
            f"     closed tab to model stopped: {closed.stopped_ms:.0f} ms with CHAT_TIMEOUTS resume="
            f"{CLOSED_TAB_GRACE_S:g}, so {settings.CHAT_RESUME_GRACE_S * 1000 + after_grace:.0f} ms "
            f"with {settings.CHAT_RESUME_GRACE_S:g} s (the grace, then {after_grace:.0f} ms)"
        )

    def api_report(self, out):
        all_rows = self.results.get("api") or []
        if not all_rows:
            return
        width = 28
        out("")
        out(
            "Over the OpenAI API: one client (bench/openai_client.py), same prompts, greedy; the "
            "transformers peer in fp32 and in its default dtype; tokens from each server's usage"
        )
        out(f"  {'figure':44}" + "".join(f" {r.target.label[:width]:>{width}}" for r in all_rows))

        def line(name, values):
            out(f"  {name:44}" + "".join(f" {v:>{width}}" for v in values))

        line("start -> answering", [bm.fmt(r.ready_s, ".1f", " s") for r in all_rows])
        line(
            "one stream: first chunk",
            [bm.fmt(r.single and r.single.first_chunk_ms, ".0f", " ms") for r in all_rows],
        )
        line(
            "one stream: tok/s (tokens)",
            [
                f"{bm.fmt(r.single_tps(), '.1f')} ({r.single.tokens if r.single else '-'})"
                for r in all_rows
            ],
        )
        line(
            "newcomer alone: first chunk",
            [
                bm.fmt(r.newcomer and r.newcomer.alone.first_chunk_ms, ".0f", " ms")
                for r in all_rows
            ],
        )

        def busy(r):
            n = r.newcomer
            if not n:
                return "-"
            x = bm.ratio(n.busy.first_chunk_ms, n.alone.first_chunk_ms)
            flag = "" if n.long_running else " (long ended)"
            return f"{bm.fmt(n.busy.first_chunk_ms, '.0f', ' ms')} ({bm.fmt(x, '.2f', 'x')}){flag}"

        line("newcomer during a long answer (x alone)", [busy(r) for r in all_rows])
        for users in self.levels:
            line(
                f"{users} user(s): agg tok/s (x 1 user)",
                [
                    f"{bm.fmt(r.agg_tps(users), '.1f')} "
                    f"({bm.fmt(bm.ratio(r.agg_tps(users), r.agg_tps(1)), '.2f', 'x')})"
                    for r in all_rows
                ],
            )
            line(
                f"{users} user(s): per-user tok/s, worst 1st chunk",
                [
                    f"{bm.fmt(r.per_user_tps(users), '.1f')}, "
                    f"{bm.fmt(r.worst_first_ms(users), '.0f', ' ms')}"
                    for r in all_rows
                ],
            )
        line("peak RSS", [bm.fmt(r.peak_rss_mb, ".0f", " MB") for r in all_rows])
        for r in all_rows:
            errors = sorted(
                {s.error for streams, _ in (r.levels or {}).values() for s in streams if s.error}
            )
            if errors:
                out(f"  errors ({r.target.label}): {'; '.join(errors)[:300]}")
