"""Time cancels and cache hits across two daphne processes on loopback (one PostgreSQL, one Redis).

    .venv/bin/python bench/scripts/crossprocess_timing.py [--rounds 5]

Starts two LiveServers on a throwaway PostgreSQL database (dropped at the end) with
REDIS_URL for the channel layer and CHAT_CACHE_REDIS_URL (default db 13, flushed) for
the cache, then prints medians of:
- cancel, same process: cancel frame with `message` on a second socket of A -> `done` on A
- cancel, other process: cancel frame with `message` on B -> `done` on A
- cache hit on B of an answer A generated: prompt sent -> `done` (cached)
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
import urllib.request
import uuid
from http.cookies import SimpleCookie
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psycopg  # noqa: E402
import redis  # noqa: E402
import websockets  # noqa: E402

from testing.liveserver import LiveServer  # noqa: E402

PG = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
LONG = "Write a very long story about a dragon who learns to bake bread."


def session_cookie(server: LiveServer) -> str:
    with urllib.request.urlopen(server.url + "/") as page:
        cookies = SimpleCookie()
        for header in page.headers.get_all("Set-Cookie"):
            cookies.load(header)
    return f"sessionid={cookies['sessionid'].value}"


async def until(ws, kind: str) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 120))
        if event["type"] == kind:
            return event


async def cancel_time(runs_on: LiveServer, cancel_on: LiveServer, cookie: str) -> float:
    def connect(server):
        return websockets.connect(
            server.ws_url, origin=server.url, additional_headers={"Cookie": cookie}
        )

    async with connect(runs_on) as ws, connect(cancel_on) as other:
        await ws.send(json.dumps({"type": "prompt", "request_id": "t", "text": LONG}))
        accepted = await until(ws, "accepted")
        await until(ws, "chunk")
        started = time.perf_counter()
        await other.send(json.dumps({"type": "cancel", "message": accepted["message"]}))
        done = await until(ws, "done")
        elapsed = time.perf_counter() - started
        assert done["finish_reason"] == "cancelled", done
        return elapsed


async def cache_hit_time(a: LiveServer, b: LiveServer, cookie: str, n: int) -> float:
    prompt = f"Say the number {n}."
    async with websockets.connect(
        a.ws_url, origin=a.url, additional_headers={"Cookie": cookie}
    ) as ws:
        await ws.send(json.dumps({"type": "prompt", "request_id": "fill", "text": prompt}))
        await until(ws, "done")
    async with websockets.connect(
        b.ws_url, origin=b.url, additional_headers={"Cookie": cookie}
    ) as ws:
        started = time.perf_counter()
        await ws.send(json.dumps({"type": "prompt", "request_id": "hit", "text": prompt}))
        done = await until(ws, "done")
        elapsed = time.perf_counter() - started
        assert done["cached"], done
        return elapsed


async def measure(a: LiveServer, b: LiveServer, rounds: int) -> None:
    cookie = session_cookie(a)
    local, remote, hits = [], [], []
    for n in range(rounds):
        local.append(await cancel_time(a, a, cookie))
        remote.append(await cancel_time(a, b, cookie))
        hits.append(await cache_hit_time(a, b, cookie, n))
    for label, values in (
        ("cancel, same process", local),
        ("cancel, other process", remote),
        ("cache hit on the other process", hits),
    ):
        print(
            f"{label:32s} median {statistics.median(values) * 1000:7.1f} ms  "
            f"(min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f}, n={len(values)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cache_url = os.environ.get("CHAT_CACHE_REDIS_URL", "redis://127.0.0.1:6379/13")
    redis.Redis.from_url(cache_url).flushdb()
    name = f"chat_timing_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    servers = []
    try:
        workdir = Path(tempfile.mkdtemp(prefix="crossprocess-"))
        env = {"CHAT_CACHE_REDIS_URL": cache_url, "CHAT_TORCH_THREADS": "1"}
        for _ in range(2):
            servers.append(
                LiveServer(
                    workdir, database_url=f"postgres://postgres@127.0.0.1:5432/{name}", **env
                ).start()
            )
        asyncio.run(measure(*servers, args.rounds))
    finally:
        for server in servers:
            server.stop()
        with psycopg.connect(PG, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
