"""Print what the remote backend costs: cancel -> upstream connection closed, and streaming overhead.

Runs the real local model behind the loopback OpenAI-compatible test server (testing/openai_server.py)
and `OpenAIBackend` against it, on 127.0.0.1 only, a bounded number of times:

    CHAT_MODEL_DTYPE=float32 .venv/bin/python bench/scripts/remote_latency.py [--reps 10] [--tokens 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chat.engine.local.loader import load_backend  # noqa: E402
from chat.engine.remote.openai_backend import OpenAIBackend, RemoteConfig  # noqa: E402
from chat.engine.types import EngineConfig  # noqa: E402
from testing.openai_server import FakeOpenAIServer  # noqa: E402

MESSAGES = [{"role": "user", "content": "Write a very long story about a dragon."}]


def cancel_once(remote: OpenAIBackend, fake: FakeOpenAIServer) -> tuple[float, float, float]:
    """(cancel -> server saw the close, cancel -> generate returned, cancel -> server's model stopped), seconds."""
    request = remote.request(MESSAGES, max_new_tokens=200)
    first = threading.Event()
    returned: list[float] = []
    worker = threading.Thread(
        target=lambda: (
            remote.generate(request, lambda _t: first.set()),
            returned.append(time.perf_counter()),
        )
    )
    worker.start()
    first.wait(120)
    served = fake.served[-1]
    cancelled_at = time.perf_counter()
    request.cancel.set()
    worker.join(120)
    served.done.wait(120)
    stopped_at = time.perf_counter()
    return (
        served.client_gone_at - cancelled_at,
        returned[0] - cancelled_at,
        stopped_at - cancelled_at,
    )


def stream_once(generate, tokens: int) -> tuple[float, float]:
    """(time to first chunk, total), seconds."""
    marks: list[float] = []
    started = time.perf_counter()
    generate(lambda _t: marks.append(time.perf_counter()))
    return marks[0] - started, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=30)
    args = parser.parse_args()
    config = EngineConfig(
        data_dir=str(ROOT / "var"),
        dtype=os.environ.get("CHAT_MODEL_DTYPE", "auto"),
        threads=int(os.environ.get("CHAT_TORCH_THREADS", "0")),
    )
    local = load_backend(config, progress=lambda line: print(line, file=sys.stderr))
    fake = FakeOpenAIServer(local).start()
    remote = OpenAIBackend(
        RemoteConfig(base_url=fake.url, model=fake.model, context_length=local.context_length),
        tokenizer=local.tokenizer,
    )
    ms = lambda values: (
        f"median {statistics.median(values) * 1000:7.1f} ms  (min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f})"
    )  # noqa: E731

    for label, stall in (("silent upstream", True), ("streaming upstream", False)):
        fake.stall_after_first_chunk = stall
        runs = [cancel_once(remote, fake) for _ in range(args.reps)]
        print(f"cancel, {label} ({args.reps} runs):")
        print(f"  cancel -> server saw the connection close   {ms([r[0] for r in runs])}")
        print(f"  cancel -> generate() returned               {ms([r[1] for r in runs])}")
        print(f"  cancel -> server's generation ended         {ms([r[2] for r in runs])}")
    fake.stall_after_first_chunk = False

    fixed = dict(max_new_tokens=args.tokens, min_new_tokens=args.tokens)
    rows = {
        "local backend.generate": lambda on: local.generate(local.request(MESSAGES, **fixed), on),
        "remote over loopback HTTP/SSE": lambda on: remote.generate(
            remote.request(MESSAGES, **fixed), on
        ),
    }
    stream_once(rows["local backend.generate"], args.tokens)  # warm-up
    print(f"streaming {args.tokens} tokens ({args.reps} runs each, alternating):")
    timings: dict[str, list] = {label: [] for label in rows}
    for _ in range(args.reps):
        for label, generate in rows.items():
            timings[label].append(stream_once(generate, args.tokens))
    for label, runs in timings.items():
        print(f"  {label:32s} first chunk {ms([r[0] for r in runs])}")
        print(f"  {'':32s} total       {ms([r[1] for r in runs])}")
    fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
