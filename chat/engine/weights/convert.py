"""`python -m chat.engine.weights.convert`: convert the bundled model once, with progress, before tests or serving."""

import os
import sys
from pathlib import Path

from . import blockquant
from .loading import converted_model_dir, ensure_default_model


def main() -> int:
    if os.environ.get("CHAT_MODEL_QUANT", "auto") in ("auto", "gguf", "gguf-q8"):
        prepare_kernels()
    if os.environ.get("CHAT_MODEL_PATH"):
        return 0  # a local model folder needs no conversion
    data_dir = Path(os.environ.get("DATA_DIR", Path(__file__).resolve().parents[3] / "var"))
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
    sys.exit(main())
