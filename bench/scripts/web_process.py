"""Print what one web process costs on each backend, side by side: memory and start-up time.

A daphne on CHAT_BACKEND=openai in front of `transformers serve --continuous-batching` (started
here, testing/peer.py) against a daphne on the local backend (the model in the process). Each is
started fresh on its own SQLite database, timed from launch to /healthz ready, asked one short
answer over a real WebSocket, and then measured from /proc: resident memory now (VmRSS), its
peak (VmHWM), and whether libtorch was ever mapped into it.

    .venv/bin/python bench/scripts/web_process.py [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import websockets  # noqa: E402

from testing.liveserver import LiveServer  # noqa: E402
from testing.peer import TransformersServe  # noqa: E402


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in MiB."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in {"VmRSS", "VmHWM"}:
                values[name] = int(rest.split()[0]) // 1024
    return values


def maps_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as maps:
        return "libtorch" in maps.read()


async def one_turn(server: LiveServer) -> str:
    async with websockets.connect(server.ws_url, origin=server.url) as ws:
        await ws.send(json.dumps({"type": "prompt", "request_id": "w", "text": "Say hello."}))
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 300))
            if event["type"] in {"done", "error"}:
                return event.get("finish_reason") or event["code"]


def measure(workdir: Path, **env: str) -> dict:
    server = LiveServer(workdir, **env).start(timeout=300)
    try:
        ended = asyncio.run(one_turn(server))
        return {
            "ready_s": server.ready_s,
            **proc_status(server.pid),
            "torch": maps_torch(server.pid),
            "ended": ended,
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="fresh processes per backend")
    args = parser.parse_args()
    rows: dict[str, list[dict]] = {"openai": [], "local": []}
    with tempfile.TemporaryDirectory() as tmp, TransformersServe() as peer:
        remote = {
            "CHAT_BACKEND": "openai",
            "CHAT_REMOTE_URL": peer.base_url,
            "CHAT_REMOTE_MODEL": peer.model,
        }
        for rep in range(args.reps):  # alternated, so a busy moment on the machine hits both
            for backend, env in (("openai", remote), ("local", {"CHAT_BACKEND": "local"})):
                workdir = Path(tmp) / f"{backend}-{rep}"
                workdir.mkdir()
                rows[backend].append(measure(workdir, **env))
                print(f"  {backend} #{rep + 1}: {rows[backend][-1]}", flush=True)
    print(f"\n{'web process':<28}{'ready (s)':>10}{'RSS (MiB)':>11}{'peak (MiB)':>12}  torch")
    for backend, label in (("openai", "CHAT_BACKEND=openai"), ("local", "CHAT_BACKEND=local")):
        runs = rows[backend]
        print(
            f"{label:<28}{statistics.median(r['ready_s'] for r in runs):>10.2f}"
            f"{statistics.median(r['VmRSS'] for r in runs):>11.0f}"
            f"{statistics.median(r['VmHWM'] for r in runs):>12.0f}  "
            f"{'mapped' if any(r['torch'] for r in runs) else 'never loaded'}"
        )
    print(f"(medians of {args.reps} fresh processes each; ready = daphne launched -> /healthz 200)")


if __name__ == "__main__":
    main()
