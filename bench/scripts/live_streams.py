"""Streams over `/v1` on a live daphne: one long answer, then rounds of concurrent users.

    .venv/bin/python bench/scripts/live_streams.py [--users 1,4,8] [--tokens 64]
    CHAT_DECODE_THREADS=2 .venv/bin/python bench/scripts/live_streams.py   # another setting

Starts one LiveServer (its own SQLite database; cache in Redis db 13, flushed before each
round) with the environment it is given, and drives it with the benchmark's own client
(bench/openai_client.py). Prints tok/s after the first chunk for the long answer, and each
round's aggregate tok/s and worst first chunk. For A/B runs of one setting against another
(docs/engine.md, "How many threads"); `make benchmark` is the full comparison.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings_bench")

import redis  # noqa: E402

from bench import openai_client as oc  # noqa: E402
from bench.benchmarking import LONG_ANSWER  # noqa: E402
from bench.scripts.openai_api_timing import MAKE_KEY  # noqa: E402
from testing.liveserver import LiveServer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="1,4,8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--long-tokens", type=int, default=200)
    args = parser.parse_args()
    cache_url = os.environ.get("BENCH_CACHE_REDIS_URL", "redis://127.0.0.1:6379/13")
    flush = redis.Redis.from_url(cache_url).flushdb
    cap = str(max(args.tokens, args.long_tokens))
    with tempfile.TemporaryDirectory() as workdir:
        server = LiveServer(
            Path(workdir), CHAT_CACHE_REDIS_URL=cache_url, CHAT_MAX_NEW_TOKENS_CAP=cap
        ).start()
        try:
            key = server.manage("shell", "-c", MAKE_KEY).strip().splitlines()[-1]
            target = oc.Target("live", "local", server.url + "/v1", "smollm2", key=key)
            oc.stream_chat(target, "Hi", 4)  # the first prefill's one-off costs
            flush()
            long = oc.stream_chat(target, LONG_ANSWER, args.long_tokens)
            if long.ok and long.first is not None and long.tokens > 1:
                rate = (long.tokens - 1) / (long.done - long.first)
                print(f"one stream: {long.tokens} tokens, {rate:.1f} tok/s after the first chunk")
            else:
                print(f"one stream failed: {long.error}")
            for users in [int(u) for u in args.users.split(",")]:
                flush()
                streams: list[oc.Stream | None] = [None] * users

                def ask(index: int, users: int = users, streams=streams) -> None:
                    prompt = f"{LONG_ANSWER} (variant {users}-{index})"
                    streams[index] = oc.stream_chat(target, prompt, args.tokens)

                workers = [threading.Thread(target=ask, args=(i,)) for i in range(users)]
                started = time.perf_counter()
                for worker in workers:
                    worker.start()
                for worker in workers:
                    worker.join()
                wall = time.perf_counter() - started
                done = [s for s in streams if s is not None and s.ok]
                worst = max((s.first_chunk_ms or 0.0) for s in done) if done else 0.0
                errors = sorted({s.error for s in streams if s is not None and s.error})
                print(
                    f"{users} user(s): {len(done)}/{users} ok, aggregate "
                    f"{sum(s.tokens for s in done) / wall:.1f} tok/s, worst first chunk {worst:.0f} ms"
                    + (f"; errors: {errors[0]}" if errors else "")
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
