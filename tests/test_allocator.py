"""glibc's malloc gives big freed buffers back once told to (chat/engine/local/allocator.py).

In a child process (the setting is process-wide and set once): big buffers interleaved with small
ones that stay, the way a prefill's activations and a document's KV sit among the decode step's
small tensors; freed, the big ones' memory must leave the process. With glibc's defaults the
first big free raises the mmap threshold, the later big buffers come from the heap, and the
small survivors pin them there.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

CHILD = r"""
import json, sys
import torch
from chat.engine.local import allocator

told = allocator.return_big_buffers() if sys.argv[1] == "fix" else False

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

first = torch.ones(4 * 1024 * 1024 // 4)  # 4 MB, mapped, freed: glibc raises its threshold
del first
before = rss_mb()
big, small = [], []
for _ in range(64):
    big.append(torch.ones(4 * 1024 * 1024 // 4))  # 4 MB each, written
    small.append(torch.ones(64))  # a survivor after each
del big
print(json.dumps({"told": told, "kept_mb": rss_mb() - before}))
"""


def run(mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc, /proc")
def test_big_buffers_go_back_to_the_system_when_freed():
    fixed = run("fix")
    assert fixed["told"]
    assert fixed["kept_mb"] < 32  # of the 256 MB freed
