"""`manage.py benchmark`'s targets (docs/benchmarks.md), and each measured figure checked
against its own: met, not met, or not measured."""

from bench import benchmarking as bm
from bench import memory_load, prefix_reuse_report

TARGETS = {
    "stream": 1.05,  # streamed total <= 1.05 x bare generate
    "first_chunk_ms": 30.0,  # first chunk at the client <= model's first token + 30 ms
    "cache_ms": 10.0,  # cache hit p50
    "scale4": 2.5,
    "newcomer": 1.5,  # a newcomer's first chunk while a long answer runs <= 1.5 x alone  # 4 users' aggregate tok/s >= 2.5 x one user's
    "ready_s": 10.0,  # warm start to ready
    "weights8": 2.0,  # 8 users' aggregate tok/s >= 2 x the same server on fp32 weights
    "weights8_ttft_ms": 2000.0,  # ... with the worst first chunk no later than this
    "rss_mb": 1.5 * 1024,  # RSS with the model
}


def met(ok) -> str:
    return "not measured" if ok is None else ("met" if ok else "not met")


class Targets:
    """The benchmark's figures against the targets. Mixed into the command."""

    results: dict  # the command's, set in handle()

    def api_targets(self) -> list:
        """The targets' ratios between the product and the peer, from one run (docs/benchmarks.md)."""
        rows = {r.target.kind: r for r in self.results.get("api") or []}
        local, peer, remote = rows.get("local"), rows.get("peer"), rows.get("remote")
        peer_auto = rows.get("peer-auto")
        lines = []

        def add(name, value, target, ok, spec=".2f", unit="x"):
            lines.append(
                (name, bm.fmt(value, spec, unit), target, None if value is None else ok(value))
            )

        if local:
            one, four, eight = local.agg_tps(1), local.agg_tps(4), local.agg_tps(8)
            add(
                "4 users vs 1 user, agg tok/s (product /v1)",
                bm.ratio(four, one),
                ">= 3.0x",
                lambda x: x >= 3.0,
            )
            add(
                "8 users vs 1 user, agg tok/s (product /v1)",
                bm.ratio(eight, one),
                ">= 5.0x",
                lambda x: x >= 5.0,
            )
            add(
                "worst first chunk, 8 users (product /v1)",
                local.worst_first_ms(8),
                "<= 2000 ms",
                lambda v: v <= 2000,
                ".0f",
                " ms",
            )
        if local and peer:
            add(
                "one stream tok/s: product / peer",
                bm.ratio(local.single_tps(), peer.single_tps()),
                ">= 1.0x",
                lambda x: x >= 1.0,
            )
            add(
                "4 users agg tok/s: product / peer",
                bm.ratio(local.agg_tps(4), peer.agg_tps(4)),
                ">= 1.0x",
                lambda x: x >= 1.0,
            )
        if local and peer_auto:
            add(
                "4 users agg tok/s: product / peer in its default dtype",
                bm.ratio(local.agg_tps(4), peer_auto.agg_tps(4)),
                ">= 1.0x",
                lambda x: x >= 1.0,
            )
        if remote and peer:
            cost = bm.ratio(remote.single_tps(), peer.single_tps())
            add(
                "web tier in front of the peer: tok/s cost",
                None if cost is None else (1 - cost) * 100,
                "<= 5 %",
                lambda v: v <= 5,
                ".1f",
                " %",
            )
            gap = (
                None
                if not (remote.single and peer.single and remote.single.first and peer.single.first)
                else remote.single.first_chunk_ms - peer.single.first_chunk_ms
            )
            add(
                "web tier in front of the peer: first chunk cost",
                gap,
                "<= 15 ms",
                lambda v: v <= 15,
                "+.0f",
                " ms",
            )
        return lines

    def targets(self, out, floors):
        r = self.results
        lines = []
        live = r.get("live")
        if live and live.ok and floors.get(live.new_tokens):
            floor = floors[live.new_tokens]
            x = live.done_ms / 1000 / floor.total_s
            lines.append(
                (
                    "streamed total (WebSocket) vs bare generate",
                    f"{x:.3f}x ({live.done_ms / 1000:.2f} s vs {floor.total_s:.2f} s, {live.new_tokens} tokens)",
                    f"<= {TARGETS['stream']:.2f}x",
                    x <= TARGETS["stream"],
                )
            )
        else:
            lines.append(
                (
                    "streamed total (WebSocket) vs bare generate",
                    "-",
                    f"<= {TARGETS['stream']:.2f}x",
                    None,
                )
            )
        ttft = live.metrics.get("ttft_ms") if live and live.ok else None
        if ttft is not None and live.first_chunk_ms is not None:
            gap = live.first_chunk_ms - ttft
            lines.append(
                (
                    "first chunk at client - model first token",
                    f"{gap:+.1f} ms (client {live.first_chunk_ms:.1f} ms, server ttft {ttft:.1f} ms)",
                    f"<= +{TARGETS['first_chunk_ms']:.0f} ms",
                    gap <= TARGETS["first_chunk_ms"],
                )
            )
        else:
            lines.append(
                (
                    "first chunk at client - model first token",
                    "-",
                    f"<= +{TARGETS['first_chunk_ms']:.0f} ms",
                    None,
                )
            )
        x = r.get("newcomer_x")
        lines.append(
            (
                "newcomer's first chunk: long answer running / alone",
                bm.fmt(x, ".2f", "x"),
                f"<= {TARGETS['newcomer']:.1f}x",
                None if x is None else x <= TARGETS["newcomer"],
            )
        )
        p50 = r.get("cache_p50")
        lines.append(
            (
                "cache hit p50 (client, prompt sent -> done)",
                bm.fmt(p50, ".1f", " ms"),
                f"<= {TARGETS['cache_ms']:.0f} ms",
                None if p50 is None else p50 <= TARGETS["cache_ms"],
            )
        )
        scale = r.get("scale", {})
        for key, name in (("batch", self.batch_label), ("queue", "batch=1")):
            if (key, 4) in scale or key == "batch":
                x = scale.get((key, 4))
                lines.append(
                    (
                        f"4 users vs 1, agg tok/s ({name})",
                        bm.fmt(x, ".2f", "x"),
                        f">= {TARGETS['scale4']:.1f}x",
                        None if x is None else x >= TARGETS["scale4"],
                    )
                )
        lines.append(self.weights_target(r.get("agg", {})))
        ready = [s.ready_s for s in self.servers if s.ready_s is not None]
        worst = max(ready) if ready else None
        lines.append(
            (
                "warm start to ready (slowest daphne)",
                bm.fmt(worst, ".2f", " s"),
                f"<= {TARGETS['ready_s']:.0f} s",
                None if worst is None else worst <= TARGETS["ready_s"],
            )
        )
        rss = [  # the shipped weights' servers: the fp32 baseline round is not what ships
            s.peak_rss_mb
            for s in self.servers
            if s.peak_rss_mb is not None and s.label != "fp32 weights"
        ]
        peak = max(rss) if rss else None
        lines.append(
            (
                "RSS with the model: daphne peak",
                bm.fmt(peak and peak / 1024, ".2f", " GB"),
                f"<= {TARGETS['rss_mb'] / 1024:.1f} GB",
                None if peak is None else peak <= TARGETS["rss_mb"],
            )
        )
        mine = r["bench_rss_mb"]
        lines.append(
            (
                "RSS with the model: benchmark process peak",
                f"{mine / 1024:.2f} GB",
                f"<= {TARGETS['rss_mb'] / 1024:.1f} GB",
                mine <= TARGETS["rss_mb"],
            )
        )
        lines.extend(self.api_targets())
        lines.extend(self.head_to_head_targets())
        lines.extend(self.relay_targets())
        lines.extend(prefix_reuse_report.targets(r.get("prefix") or {}))
        lines.extend(memory_load.targets(r.get("memory") or []))
        out("")
        out("Targets (docs/benchmarks.md)")
        out(f"  {'figure':50} {'measured':52} {'target':>10}  result")
        for name, measured, target, ok in lines:
            out(f"  {name:50} {measured:52} {target:>10}  {met(ok)}")

    def weights_target(self, agg: dict) -> tuple:
        """8 users' aggregate on the shipped weights against the same server on fp32 weights,
        both from this run, with the worst first chunk of the shipped weights' round."""
        name = "8 users agg tok/s: shipped weights / fp32 weights"
        target = f">= {TARGETS['weights8']:.1f}x"
        users = max((u for key, u in agg if key == "fp32"), default=None)
        shipped = agg.get(("batch", users)) if users else None
        fp32 = agg.get(("fp32", users)) if users else None
        if not shipped or not fp32:
            return (name, "-", target, None)
        x = bm.ratio(shipped[0], fp32[0])
        worst = shipped[1]
        ok = (
            None
            if x is None or worst is None
            else x >= TARGETS["weights8"] and worst <= TARGETS["weights8_ttft_ms"]
        )
        measured = (
            f"{bm.fmt(x, '.2f', 'x')} at {users} users ({shipped[0]:.1f} vs {fp32[0]:.1f}), "
            f"worst first chunk {bm.fmt(worst, '.0f', ' ms')}"
        )
        return (name, measured, target + f", <= {TARGETS['weights8_ttft_ms'] / 1000:.0f} s", ok)
