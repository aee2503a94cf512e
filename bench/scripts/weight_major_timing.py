"""One decode step of the running batch at 1 to 8 rows: plain matmuls vs weight-major, side by side.

    PYTHONPATH=. .venv/bin/python bench/scripts/weight_major_timing.py [--steps 16] [--rows 1,2,4,8]

The engine makes the same comparison at load with one 4-row step, timed by the same
`LocalBackend.time_decode_step` (chat/engine/weights/weight_major.py); this prints it per batch size, best
of --steps each.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings_bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rows", default="1,2,4,8")
    args = parser.parse_args()
    import django

    django.setup()
    from dataclasses import replace

    import torch

    from chat.engine.local.loader import load_backend
    from chat.engine.weights import weight_major
    from chat.infra.runtime import runtime

    config = replace(runtime.engine_config(), weight_major="off")
    backend = load_backend(config, progress=lambda line: None)
    print(
        f"{backend.model.dtype}, {torch.get_num_threads()} threads, 1-min load "
        f"{os.getloadavg()[0]:.1f}; best of {args.steps} steps"
    )
    print(f"  {'rows':>4} {'plain':>9} {'weight-major':>13} {'speed-up':>9} {'tok/s':>13}")
    for rows in [int(r) for r in args.rows.split(",")]:
        weight_major.unwrap_all(backend.model)
        plain = backend.time_decode_step(rows, args.steps)
        weight_major.wrap(backend.model)
        major = backend.time_decode_step(rows, args.steps)
        print(
            f"  {rows:>4} {plain * 1000:>6.1f} ms {major * 1000:>10.1f} ms {plain / major:>8.2f}x "
            f"{rows / plain:>6.1f} -> {rows / major:.1f}"
        )


if __name__ == "__main__":
    main()
