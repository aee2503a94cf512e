"""CPU the web tier spends per streamed token in front of the peer, and the peer's own.

    PYTHONPATH=. .venv/bin/python bench/scripts/web_tier_cpu.py [--tokens 128] [--rounds 2]

Starts `transformers serve --continuous-batching` (testing/peer.py) and a daphne on
CHAT_BACKEND=openai in front of it, streams answers through the product's /v1 with the benchmark's
client, and reads both processes' CPU seconds (/proc/PID/stat) around each answer. On a machine
where both share the cores, the web tier's CPU per token is what it takes from decoding.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings_bench")

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import django

    django.setup()
    from bench import benchmarking as bm
    from bench import openai_client as oc
    from testing.peer import TransformersServe

    prompt = "Write a long, detailed story about a lighthouse keeper."
    with tempfile.TemporaryDirectory() as tmp, TransformersServe() as peer:
        env = {
            "CHAT_BACKEND": "openai",
            "CHAT_REMOTE_URL": peer.base_url,
            "CHAT_REMOTE_MODEL": peer.model,
        }
        with bm.daphne(Path(tmp), "web tier", premigrate=True, **env) as run:
            key = bm.api_key(run.server)
            web = oc.Target("web", "remote", run.server.url + "/v1", "smollm2", key=key)
            direct = oc.Target("peer", "peer", peer.base_url, peer.model)
            oc.stream_chat(web, "Hi", 4)
            web_pid, peer_pid = run.server.process.pid, peer.pid
            print(
                f"{'through':8} {'tokens':>6} {'tok/s':>6} {'web CPU ms/token':>17} {'peer CPU ms/token':>18}"
            )
            for i in range(args.rounds):
                for target in (direct, web):
                    bm.flush_cache_db()
                    w0, p0 = cpu_seconds(web_pid), cpu_seconds(peer_pid)
                    stream = oc.stream_chat(target, f"{prompt} ({i})", args.tokens)
                    w1, p1 = cpu_seconds(web_pid), cpu_seconds(peer_pid)
                    n = max(stream.tokens, 1)
                    print(
                        f"{target.label:8} {stream.tokens:>6} "
                        f"{n / stream.total_s if stream.total_s else 0:>6.1f} "
                        f"{(w1 - w0) * 1000 / n:>17.2f} {(p1 - p0) * 1000 / n:>18.1f}"
                    )


if __name__ == "__main__":
    main()
