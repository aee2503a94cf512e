"""Start the engine on a `.gguf` file in this process and say how long it took and what it held.

    PYTHONPATH=. .venv/bin/python bench/scripts/gguf_start.py var/gguf-formats/NAME.gguf [--quant gguf]

Prints seconds until the backend is ready, the peak resident memory (VmHWM) and the resident
memory then (VmRSS), and the start-up log's weights line. One start a process, so the peak is
this start's: to compare two checkouts, run it from each, one after the other.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a .gguf file")
    parser.add_argument("--quant", default="gguf", help="the weight mode (CHAT_ENGINE quant=)")
    args = parser.parse_args()
    started = time.perf_counter()
    from chat.engine.local.loader import load_backend
    from chat.engine.types import EngineConfig

    lines: list[str] = []
    with tempfile.TemporaryDirectory() as data:
        config = EngineConfig(model_path=args.path, data_dir=data, quant=args.quant)
        load_backend(config, progress=lines.append)
        seconds = time.perf_counter() - started
    status = Path("/proc/self/status").read_text()
    peak, resident = (
        int(re.search(rf"{key}:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
        for key in ("VmHWM", "VmRSS")
    )
    print(
        f"{Path(args.path).name}: ready in {seconds:.1f} s, VmHWM {peak:.0f} MB, VmRSS {resident:.0f} MB"
    )
    print("  " + next((line for line in lines if "weights" in line), "(no weights line)").strip())


if __name__ == "__main__":
    main()
