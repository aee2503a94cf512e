"""Time how long a server takes to exit after SIGTERM, idle and with an answer running.

    .venv/bin/python bench/scripts/shutdown_timing.py [--rounds 3] [--drain 10]

Each round starts a fresh server on loopback (its own SQLite database; the cache on
CHAT_CACHE_REDIS_URL, default redis://127.0.0.1:6379/13), waits for /healthz 200, and prints
the median over rounds of:
- idle, daphne: SIGTERM -> process gone (testing/liveserver.py's `python -m daphne`)
- idle, project.serve: the same for `make run`'s command with the embedded Redis
  (REDIS_URL unset, a throwaway DATA_DIR)
- busy: a long answer streaming over a WebSocket when SIGTERM comes; SIGTERM -> the answer's
  `done` (or the socket dropping), its finish_reason, the close code, SIGTERM -> process gone.
  With CHAT_DRAIN_SECONDS = --drain the answer is cancelled after the drain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import websockets  # noqa: E402

from testing.liveserver import ROOT, LiveServer  # noqa: E402

LONG = "Write a very long story about a dragon who learns to bake bread."


def server(workdir: Path, *, serve: bool, drain: float) -> LiveServer:
    env = {
        "CHAT_CACHE_REDIS_URL": os.environ.get("CHAT_CACHE_REDIS_URL", "redis://127.0.0.1:6379/13"),
        "CHAT_DRAIN_SECONDS": str(drain),
    }
    if serve:
        env |= {
            "DATA_DIR": str(workdir / "data"),
            "CHAT_MODEL_PATH": str(ROOT / "var" / "models" / "SmolLM2-135M-Instruct"),
        }
        made = LiveServer(workdir, serve=True, **env)
        for name in ("REDIS_URL", "CHAT_CACHE_REDIS_URL"):
            made.env.pop(name, None)
        return made
    return LiveServer(workdir, **env)


def exit_seconds(live: LiveServer, signalled: float) -> float:
    live.process.wait(120)
    return time.perf_counter() - signalled


def idle(serve: bool, drain: float) -> float:
    with tempfile.TemporaryDirectory() as workdir:
        live = server(Path(workdir), serve=serve, drain=drain).start()
        time.sleep(1)  # settled: no request of start() still open
        signalled = time.perf_counter()
        live.process.terminate()
        return exit_seconds(live, signalled)


async def busy(drain: float) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        live = server(Path(workdir), serve=False, drain=drain).start()
        async with websockets.connect(live.ws_url, origin=live.url) as ws:
            await ws.send(json.dumps({"type": "prompt", "request_id": "long", "text": LONG}))
            while json.loads(await ws.recv())["type"] != "chunk":
                pass
            signalled = time.perf_counter()
            live.process.terminate()
            ended, finish, code = None, "dropped", None
            try:
                while True:
                    event = json.loads(await asyncio.wait_for(ws.recv(), 120))
                    if event["type"] == "done":
                        ended, finish = time.perf_counter() - signalled, event["finish_reason"]
            except websockets.ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd else None
                if ended is None:
                    ended = time.perf_counter() - signalled
        gone = await asyncio.to_thread(exit_seconds, live, signalled)
        return {"answer_end": ended, "finish": finish, "close_code": code, "exit": gone}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drain", type=float, default=10.0, help="CHAT_DRAIN_SECONDS")
    args = parser.parse_args()

    daphne_idle = [idle(False, args.drain) for _ in range(args.rounds)]
    serve_idle = [idle(True, args.drain) for _ in range(args.rounds)]
    runs = [asyncio.run(busy(args.drain)) for _ in range(args.rounds)]

    def line(label: str, values: list[float]) -> None:
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{label:<42} median {statistics.median(values):6.2f} s   ({shown})")

    print(f"SIGTERM -> exit, {args.rounds} round(s), CHAT_DRAIN_SECONDS={args.drain:g}")
    line("idle, daphne", daphne_idle)
    line("idle, project.serve (embedded Redis)", serve_idle)
    line("busy: SIGTERM -> the answer's end", [r["answer_end"] for r in runs])
    line("busy: SIGTERM -> process gone", [r["exit"] for r in runs])
    print(
        "busy: how the answer ended / close code:",
        ", ".join(f"{r['finish']}/{r['close_code']}" for r in runs),
    )


if __name__ == "__main__":
    main()
