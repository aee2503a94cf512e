"""The head-to-head against llama-server, for this checkout and an earlier one, in one run.

A change that should not move the engine's speed (a layout pass, say) is checked by racing both
checkouts' `/v1` and one `llama-server` on the bundled GGUF (or `--model FILE`, another .gguf),
rounds interleaved, so the machine's noise falls on all three alike:

    git worktree add /tmp/before <commit> && ln -s "$PWD/var" /tmp/before/var
    (cd /tmp/before && ../path/to/.venv/bin/python -m chat.engine.weights.convert)
    DJANGO_SETTINGS_MODULE=project.settings_bench PYTHONPATH=. .venv/bin/python \
        bench/scripts/before_after_race.py --baseline /tmp/before [--tokens 64] [--rounds 2]

Prints the head-to-head table for each checkout against the same llama-server, then each figure
after / before.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import django

    django.setup()
    from bench import benchmarking as bm
    from bench import head_to_head as h2h
    from chat.engine.weights.loading import bundled_gguf_path
    from harness.liveserver import LiveServer
    from harness.peer import LlamaServer, llama_server

    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", type=Path, required=True, help="the earlier checkout")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--levels", default="1,8")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument(
        "--model", type=Path, help="a .gguf file all three run (default: the bundled one)"
    )
    args = parser.parse_args()
    binary = llama_server()
    if binary is None:
        sys.exit("llama-server is not built on this machine: `make llama-peer`")
    levels = [int(x) for x in args.levels.split(",")]
    env = {
        "DJANGO_SETTINGS_MODULE": "project.settings_bench",
        "REDIS_URL": bm.CHANNEL_REDIS_URL,
        "CHAT_CACHE_REDIS_URL": bm.CACHE_REDIS_URL,
        "CHAT_RATE_LIMITS": "prompt=0",
        "CHAT_LIMITS": f"new_tokens_cap={args.tokens}",
    }
    model = args.model.resolve() if args.model else bundled_gguf_path()
    if args.model:
        env["CHAT_MODEL_PATH"] = str(model)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="before-after-")))
        peer = LlamaServer(
            model,
            binary=binary,
            slots=args.slots,
            log_path=tmp / "llama-server.log",
        )
        server = stack.enter_context(peer)
        runs = {}
        for name, root in (("after", ROOT), ("before", args.baseline.resolve())):
            (tmp / name).mkdir()
            live = LiveServer(tmp / name, root=root, serve=True, DEBUG="0", **env)
            stack.callback(live.stop)
            live.manage("migrate", "-v0")
            started = time.perf_counter()
            live.start(timeout=300)
            runs[name] = SimpleNamespace(server=live, ready_s=time.perf_counter() - started)
        after, llama = h2h.sides(runs["after"], server, f"after ({ROOT.name})", "llama-server")
        before, _ = h2h.sides(runs["before"], server, f"before ({args.baseline.name})", "-")
        h2h.race(
            [after, before, llama],
            prompt="Write a long, detailed story about a lighthouse keeper.",
            tokens=args.tokens,
            levels=levels,
            busy=args.slots,
            rounds=args.rounds,
            note=lambda line: print(line, file=sys.stderr),
        )
        for side in (after, before):
            print()
            print(
                "\n".join(
                    h2h.report(side, llama, slots=args.slots, busy=args.slots, rounds=args.rounds)
                )
            )
        print()
        for users in levels:

            def tps(side, users=users):
                values = [level.aggregate_tps() for level in side.levels.get(users, [])]
                values = [v for v in values if v is not None]
                return statistics.median(values) if values else None

            a, b = tps(after), tps(before)
            ratio = f"{a / b:.2f}x" if a and b else "-"
            shown = [f"{v:.1f}" if v else "-" for v in (a, b)]
            print(
                f"{users} user(s) agg tok/s, median: after {shown[0]} / before {shown[1]} = {ratio}"
            )


if __name__ == "__main__":
    main()
