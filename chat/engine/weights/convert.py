"""`python -m chat.engine.weights.convert`: convert the bundled model once, with progress, before tests or serving."""

import argparse
import sys
from pathlib import Path

from . import blockquant
from .loading import converted_model_dir, ensure_default_model


def main(argv: list[str]) -> int:
    """The caller passes what project/settings.py read (the engine reads no environment)."""
    parser = argparse.ArgumentParser(prog="python -m chat.engine.weights.convert")
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[3] / "var"))
    parser.add_argument("--model-path", default="", help="a local model folder: no conversion")
    parser.add_argument("--quant", default="auto")
    args = parser.parse_args(argv)
    if args.quant in ("auto", "gguf", "gguf-q8"):
        prepare_kernels()
    if args.model_path:
        return 0  # a local model folder needs no conversion
    data_dir = Path(args.data_dir)
    ensure_default_model(data_dir, progress=lambda line: print(line, flush=True))
    print(f"Model ready at {converted_model_dir(data_dir)}", flush=True)
    return 0


def prepare_kernels() -> None:
    """Compile the block-quant kernels once, so the first start does not pay for it."""
    if blockquant.kernels(progress=lambda line: print(line, flush=True)) is not None:
        print("Block-quant kernels ready", flush=True)
    else:
        print(
            f"Block-quant kernels unavailable ({blockquant.failure()}): float weights", flush=True
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
