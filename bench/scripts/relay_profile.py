"""What the web tier costs per relayed token: CPU ms, resident memory, and where the time goes.

A scripted OpenAI-compatible upstream (aiohttp, its own process) streams each request's tokens
at a fixed rate, one SSE event per token as llama-server does; the product runs in front of it
(`CHAT_BACKEND=openai`) and N clients stream `/v1/chat/completions` through it at once. The web
process's CPU time (utime + stime from /proc) over the run, divided by the tokens the clients
received, is the figure; with --py-spy PATH it also records where that time went.

    .venv/bin/python bench/scripts/relay_profile.py --users 8 --tokens 256 --rate 25

With --baseline DIR another checkout (a `git worktree add DIR <commit>`, with `var` linked) runs
beside it against the same upstream, rounds alternating, so a change is measured against what it
changed in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.liveserver import LiveServer, free_port  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def upstream(port: int, tokens: int, rate: float) -> None:
    """A scripted OpenAI-compatible server: `tokens` one-word deltas at `rate` per second each."""
    from aiohttp import web

    async def models(_request):
        return web.json_response(
            {"object": "list", "data": [{"id": "scripted", "object": "model"}]}
        )

    async def completions(request):
        body = await request.json()
        wanted = min(int(body.get("max_tokens") or tokens), tokens)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        base = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "scripted"}
        started = time.monotonic()
        for n in range(wanted):
            delay = started + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            delta = {
                "choices": [{"index": 0, "delta": {"content": f"w{n} "}, "finish_reason": None}]
            }
            try:
                await response.write(f"data: {json.dumps(base | delta)}\n\n".encode())
            except ConnectionError:  # the relay hung up (it had what it asked for)
                return response
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        usage = {
            "usage": {"prompt_tokens": 12, "completion_tokens": wanted, "total_tokens": wanted + 12}
        }
        await response.write(f"data: {json.dumps(base | end | usage)}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", completions)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def cpu_split(pid: int) -> tuple[float, float]:
    """The process's user and system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS  # utime, stime


def status_mb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


async def clients(url: str, key: str, users: int, tokens: int, round_: str) -> tuple[int, float]:
    """`users` streams at once, each a distinct prompt (no cache hit); the tokens received and
    the slowest first chunk (ms after its request was sent)."""
    import httpx

    async def one(i: int) -> tuple[int, float]:
        body = {
            "model": "smollm2",
            "stream": True,
            "max_tokens": tokens,
            "messages": [{"role": "user", "content": f"round {round_} user {i}: tell me more"}],
        }
        received, sent, first = 0, time.perf_counter(), 0.0
        async with httpx.AsyncClient(timeout=300) as client:
            headers = {"Authorization": f"Bearer {key}"}
            async with client.stream(
                "POST", url + "/v1/chat/completions", json=body, headers=headers
            ) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunk = json.loads(line[6:])
                        if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                            # Counted in the upstream's tokens ("w12 "): a relay may send several
                            # in one chunk.
                            received += len(chunk["choices"][0]["delta"]["content"].split())
                            first = first or (time.perf_counter() - sent) * 1000
        return received, first

    results = await asyncio.gather(*(one(i) for i in range(users)))
    return sum(r for r, _ in results), max(f for _, f in results)


class Side:
    """One web process in front of the upstream: its CPU seconds and tokens over the measured rounds."""

    def __init__(self, label: str, root: Path, port: int, users: int):
        from bench import benchmarking as bm

        self.label = label
        workdir = Path(tempfile.mkdtemp(prefix="relay-"))
        env = {
            "CHAT_BACKEND": "openai",
            "CHAT_REMOTE": f"http://127.0.0.1:{port}/v1?model=scripted&concurrency={users * 2}",
            "REDIS_URL": bm.CACHE_REDIS_URL,
            "DJANGO_SETTINGS_MODULE": "project.settings_bench",
            "CHAT_RATE_LIMITS": "prompt=0",  # both sides' `bench` users are one user to Redis
            "DEBUG": "0",  # as `make run` serves (the bench settings' DEBUG logs every query)
        }
        # `python -m project.serve`, as `make run` and the benchmark's relay race start it.
        self.server = LiveServer(workdir, root=root, serve=True, **env).start(wait_for_model=True)
        self.key = bm.api_key(self.server)
        self.cpu = self.user = self.elapsed = 0.0
        self.received = 0
        self.worst_first_ms: list[float] = []

    @property
    def pid(self) -> int:
        assert self.server.pid is not None
        return self.server.pid

    def measure(self, users: int, tokens: int, round_: int) -> None:
        (user, system), started = cpu_split(self.pid), time.perf_counter()
        # Each side its own prompts: the other's answers are in the same Redis cache.
        round_name = f"{round_} of {self.label}"
        received, worst_first = asyncio.run(
            clients(self.server.url, self.key, users, tokens, round_name)
        )
        self.received += received
        self.worst_first_ms.append(worst_first)
        self.elapsed += time.perf_counter() - started
        user_after, system_after = cpu_split(self.pid)
        self.user += user_after - user
        self.cpu += user_after + system_after - user - system

    def report(self) -> list[str]:
        pid = self.pid
        return [
            f"{self.label}:",
            f"  tokens relayed        {self.received}",
            f"  slowest first chunk   {statistics.median(self.worst_first_ms):.0f} ms (median of rounds)",
            f"  relayed tok/s         {self.received / max(self.elapsed, 1e-9):.0f}",
            f"  web CPU ms per token  {1000 * self.cpu / max(self.received, 1):.3f} "
            f"(user {1000 * self.user / max(self.received, 1):.3f})",
            f"  web RSS               {status_mb(pid, 'VmRSS'):.0f} MB "
            f"(peak {status_mb(pid, 'VmHWM'):.0f} MB)",
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per answer")
    parser.add_argument("--rate", type=float, default=25.0, help="tokens a second per stream")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--py-spy", help="record the web process with py-spy to this file")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. a `git worktree` of the commit before) measured in the same "
        "run, its rounds alternating with this one's",
    )
    args = parser.parse_args()

    port = free_port()
    server_process = multiprocessing.Process(
        target=upstream, args=(port, args.tokens, args.rate), daemon=True
    )
    server_process.start()
    from bench import benchmarking as bm

    bm.flush_cache_db()
    sides: list[Side] = []
    try:
        sides.append(Side(f"this checkout ({ROOT})", ROOT, port, args.users))
        if args.baseline:
            sides.append(
                Side(f"baseline ({args.baseline})", args.baseline.resolve(), port, args.users)
            )
        for side in sides:  # warm: imports, connections
            asyncio.run(clients(side.server.url, side.key, args.users, 4, f"warm {side.label}"))
        spy = None
        if args.py_spy:
            spy = subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "--gil",
                    "-o",
                    args.py_spy,
                    "--format",
                    "raw",
                    "-r",
                    "200",
                    "-p",
                    str(sides[0].pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1)
        for n in range(args.rounds):
            # The order swaps every round, so a burst of other work lands on both sides.
            for side in sides if n % 2 == 0 else sides[::-1]:
                side.measure(args.users, args.tokens, n + 1)
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on an interrupt
            spy.wait()
        print(
            f"users {args.users}, {args.tokens} tokens each at {args.rate:g} tok/s, {args.rounds} rounds"
        )
        for side in sides:
            print("\n".join(side.report()))
    finally:
        for side in sides:
            side.server.stop()
        server_process.terminate()


if __name__ == "__main__":
    main()
