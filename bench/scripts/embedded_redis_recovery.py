"""Time how long `project.serve` takes to bring back its embedded Redis after it is killed.

    .venv/bin/python bench/scripts/embedded_redis_recovery.py [--rounds 5]

Starts `python -m project.serve` with REDIS_URL unset and a throwaway DATA_DIR (so the
embedded Redis is its own), waits for /healthz 200, then each round SIGKILLs the
redis-server and prints the median of:
- kill -> a new redis-server answers PING on the same socket (the watchdog's restart)
- kill -> /healthz says redis, cache and rate_limit "ok" again (polled every 20 ms)
The watchdog checks every 0.5 s (project/embedded_redis.py WATCH_SECONDS), so expect 0-0.5 s
plus the start of a redis-server.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from project.embedded_redis import EmbeddedRedis  # noqa: E402
from testing.liveserver import ROOT, LiveServer  # noqa: E402


def healthy(live: LiveServer) -> bool:
    status, report = live.health()
    return status == 200 and all(report[k] == "ok" for k in ("redis", "cache", "rate_limit"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        data = Path(workdir) / "data"
        live = LiveServer(
            Path(workdir),
            serve=True,
            DATA_DIR=str(data),
            CHAT_MODEL_PATH=str(ROOT / "var" / "models" / "SmolLM2-135M-Instruct"),
        )
        for name in ("REDIS_URL", "CHAT_CACHE_REDIS_URL"):
            live.env.pop(name, None)
        live.start()
        embedded = EmbeddedRedis(data)
        answering, health = [], []
        try:
            for _ in range(args.rounds):
                old = int((embedded.home / "redis.pid").read_text())
                killed = time.perf_counter()
                os.kill(old, signal.SIGKILL)
                time.sleep(0.01)  # the socket refuses from now on
                while not embedded.answers():
                    time.sleep(0.005)
                answering.append(time.perf_counter() - killed)
                while not healthy(live):
                    time.sleep(0.02)
                health.append(time.perf_counter() - killed)
                # A random pause: a fixed one would lock the kill to the watchdog's tick.
                time.sleep(1 + random.random())
        finally:
            live.stop()
    for label, values in (("kill -> Redis answers", answering), ("kill -> /healthz ok", health)):
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{label:<24} median {statistics.median(values):5.2f} s   ({shown})")


if __name__ == "__main__":
    main()
