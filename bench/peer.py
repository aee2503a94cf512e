"""The peer: a newcomer's first chunk at `transformers serve --continuous-batching`, alone and while
a long answer streams, and one stream's speed; same model folder, greedy, fp32.

Run: `PYTHONPATH=. .venv/bin/python bench/peer.py` (needs the transformers[serving] extra:
fastapi, uvicorn, not pinned yet). Not yet a row of `make benchmark` (issue 12).
"""

import json
import os
import subprocess
import threading
import time

import requests

from bench.liveserver import free_port

model = os.path.realpath("var/models/SmolLM2-135M-Instruct")
port = free_port()
proc = subprocess.Popen(
    [
        ".venv/bin/transformers",
        "serve",
        "--continuous-batching",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        model,
    ],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.STDOUT,
)
base = f"http://127.0.0.1:{port}"
try:
    t0 = time.time()
    while time.time() - t0 < 240:
        try:
            requests.get(base + "/v1/models", timeout=2)
            break  # any answer: the server is up (it loads the forced model before listening)
        except requests.RequestException:
            time.sleep(1)
    print(f"listening after {time.time() - t0:.1f} s", flush=True)

    def stream(prompt, max_tokens, box, stop=None):
        box["sent"] = time.perf_counter()
        n = 0
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": 0,
        }
        with requests.post(base + "/v1/chat/completions", json=body, timeout=600, stream=True) as r:
            for line in r.iter_lines(decode_unicode=True):
                if not line.startswith("data: ") or line.endswith("[DONE]"):
                    continue
                d = json.loads(line[6:])
                c = d["choices"][0]["delta"].get("content")
                if c:
                    n += 1
                    box.setdefault("first", time.perf_counter())
                    if stop is not None and stop.is_set():
                        break
        box["done"] = time.perf_counter()
        box["n"] = n

    warm = {}
    stream("Hi", 4, warm)
    alone = {}
    stream("Say hello in five words.", 24, alone)
    stop = threading.Event()
    long = {}
    th = threading.Thread(
        target=stream, args=("Write a 600-word story about a lighthouse keeper.", 200, long, stop)
    )
    th.start()
    while "first" not in long:
        time.sleep(0.05)
    time.sleep(1.0)
    busy = {}
    stream("Say hello in five words.", 24, busy)
    running = "done" not in long
    stop.set()
    th.join(300)
    a = alone["first"] - alone["sent"]
    b = busy["first"] - busy["sent"]
    print(
        f"peer newcomer first chunk: alone {a * 1000:.0f} ms, while a long answer streams "
        f"{b * 1000:.0f} ms ({b / a:.2f}x); long answer still running: {running}"
    )
    one = {}
    stream("Write a long story about a dragon.", 32, one)
    print(
        f"peer single stream: {one['n']} chunks in {one['done'] - one['sent']:.2f} s, "
        f"first chunk {(one['first'] - one['sent']) * 1000:.0f} ms"
    )
finally:
    proc.terminate()
    proc.wait(30)
