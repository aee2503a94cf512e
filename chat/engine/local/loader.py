"""Load the local model: its folder found (and converted once) by weights/, or a GGUF file named
by CHAT_MODEL_PATH (gguf_backend.py), a LocalBackend built.

`load_backend` is the plain-Python way in (see chat/engine/__init__.py). This module imports no
torch until it is called, so a process that never loads the model never pays for it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..types import EngineConfig, Progress
from ..weights.loading import (
    ModelNotFound,
    bundled_gguf_path,
    is_gguf_file,
    resolve_model_dir,
    weights_fingerprint,
)

if TYPE_CHECKING:
    from .backend import LocalBackend

log = logging.getLogger(__name__)


def load_backend(config: EngineConfig | None = None, progress: Progress = log.info) -> LocalBackend:
    """Load model and tokenizer and return a ready LocalBackend."""
    from .backend import LocalBackend  # here: importing it loads torch

    config = config or EngineConfig()
    if is_gguf_file(config.model_path):
        from .gguf_backend import load_gguf_backend

        return load_gguf_backend(Path(str(config.model_path)), config, progress=progress)
    model_dir = resolve_model_dir(config, progress)
    fingerprint = weights_fingerprint(model_dir, config.data_dir)
    gguf = None
    if not config.model_path and config.quant in ("auto", "int4", "gguf", "gguf-q8"):
        try:
            gguf = bundled_gguf_path()  # the blocks the converted copy came from
        except ModelNotFound:
            gguf = None
    return LocalBackend.from_folder(
        model_dir, config, fingerprint=fingerprint, progress=progress, gguf=gguf
    )
