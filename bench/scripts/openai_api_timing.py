"""Time the OpenAI-compatible API with the official `openai` package against a live daphne.

    .venv/bin/python bench/scripts/openai_api_timing.py [--rounds 5] [--tokens 32]

Starts one LiveServer (its own SQLite database; cache in Redis db BENCH_CACHE_REDIS_URL,
default 13, flushed), makes a key, and prints medians of:
- API overhead to the first delta: the client's first content delta minus the server's own
  ttft_ms (stored metrics of the same answer), streamed, distinct prompts (no cache)
- a cache hit, stream false: request sent -> completion parsed
- cancel: after the client closes the stream at its 3rd delta, how many more tokens the
  model generated (stored new_tokens - deltas seen; a delta is about one token)
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import openai  # noqa: E402
import redis  # noqa: E402

from testing.liveserver import LiveServer  # noqa: E402

MAKE_KEY = """
from django.contrib.auth import get_user_model
from chat.stores.apikeys import apikey_create
user, _ = get_user_model().objects.get_or_create(username="bench")
print(apikey_create(user=user, name="bench")[1])
"""


def stored(db_path: str, request_id: str) -> dict:
    for _ in range(600):
        with sqlite3.connect(db_path) as db:
            row = db.execute(
                "SELECT status, metrics FROM chat_message WHERE request_id = ?", (request_id,)
            ).fetchone()
        if row and row[0] != "streaming":
            return json.loads(row[1])
        time.sleep(0.05)
    raise RuntimeError(f"{request_id} never ended")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    cache_url = os.environ.get("BENCH_CACHE_REDIS_URL", "redis://127.0.0.1:6379/13")
    redis.Redis.from_url(cache_url).flushdb()
    with tempfile.TemporaryDirectory() as workdir:
        server = LiveServer(Path(workdir), CHAT_CACHE_REDIS_URL=cache_url).start()
        try:
            db_path = server.env["DATABASE_URL"].removeprefix("sqlite:///")
            key = server.manage("shell", "-c", MAKE_KEY).strip().splitlines()[-1]
            api = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
            overhead, hits, extra = [], [], []
            for n in range(args.rounds):
                prompt = f"Count from {n + 3} to {n + 30}, separated by commas."
                sent = time.perf_counter()
                first = None
                for chunk in api.chat.completions.create(
                    model="smollm2",
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=args.tokens,
                    stream=True,
                ):
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = (time.perf_counter() - sent) * 1000
                    completion_id = chunk.id
                metrics = stored(db_path, completion_id)
                overhead.append(first - metrics["ttft_ms"])
                sent = time.perf_counter()
                answer = api.chat.completions.create(
                    model="smollm2",
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=args.tokens,
                )
                hit_ms = (time.perf_counter() - sent) * 1000
                if answer.model_extra.get("cached"):
                    hits.append(hit_ms)
                stream = api.chat.completions.create(
                    model="smollm2",
                    messages=[{"role": "user", "content": f"Write a long story number {n}."}],
                    max_tokens=300,
                    stream=True,
                )
                seen = 0
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        seen += 1
                        if seen == 3:
                            break
                stream.close()
                extra.append(stored(db_path, chunk.id)["new_tokens"] - seen)
        finally:
            server.stop()
    print(f"rounds {args.rounds}, max_tokens {args.tokens}")
    print(
        f"API overhead to the first delta (client - server ttft), median: {statistics.median(overhead):.1f} ms"
    )
    if hits:
        print(f"cache hit, stream false, median of {len(hits)}: {statistics.median(hits):.1f} ms")
    else:
        print("cache hit: none (the answers ended on length, which is never cached)")
    print(
        f"tokens generated after the client closed the stream, median: {statistics.median(extra)} (max {max(extra)})"
    )


if __name__ == "__main__":
    main()
