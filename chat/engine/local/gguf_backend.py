"""A LocalBackend for a model that is one GGUF file (CHAT_MODEL_PATH=/path/model.gguf).

The file is checked first (weights/gguf_file.py: an architecture transformers cannot build or a
tensor type with no kernel is one start-up error), then transformers builds the config and the
tokenizer with its chat template from the file's metadata. For Llama and Qwen2 the linears are
the file's own blocks (the weight mode `gguf`, or `gguf-q8`; `auto` takes the blocks where the
kernels build), so the fused decode step runs them: the model is built around them and its float
linears never exist (a file with float projections loads the float model and swaps the rest).
Another architecture, `quant=none`, or a CPU without the kernels under `auto` loads transformers'
float model and forward. `int8` and `int4` quantize the float model as for a folder.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from ..types import EngineConfig, Progress
from ..weights import blockquant, gguf_file, quant_choice
from ..weights.loading import weights_fingerprint
from . import attention
from .backend import LocalBackend
from .device import pick_device, pick_dtype
from .threads import ThreadPlan

log = logging.getLogger(__name__)


def load_gguf_backend(
    path: Path, config: EngineConfig, *, progress: Progress = log.info
) -> LocalBackend:
    """Load the model in the GGUF file `path`; raises gguf_file.UnsupportedModelFile (one error
    naming the architecture or tensor types) for a file this engine cannot run."""
    architecture, reader = gguf_file.check_runnable(path)
    fingerprint = weights_fingerprint(path, config.data_dir)
    threads = ThreadPlan.configured(config.threads, config.decode_threads)
    torch.set_num_threads(threads.prefill)
    device = pick_device(config.device)
    dtype = pick_dtype(config.dtype, device)
    started = time.perf_counter()
    progress(f"Loading {path.name} ({architecture}, {dtype}, {device}, {threads.describe()})...")
    attn = attention.register() if device == "cpu" else None
    mode = config.quant
    why_not = _why_not_blocks(path, architecture, mode, device, dtype, progress)
    if why_not is None:  # the blocks, without ever building the float linears
        loaded = gguf_file.load_around_blocks(
            path, reader, architecture, dtype, attn, int8_activations=mode == "gguf-q8"
        )
        if loaded is not None:
            model, tokenizer, counts = loaded
            backend = LocalBackend(
                model, tokenizer, config, model_id=path.name, fingerprint=fingerprint
            )
            line = f"weights {mode}: {gguf_file.describe_counts(counts)}"
            return backend.ready(line, device, progress, started)
    model, tokenizer = gguf_file.load_model_and_tokenizer(path, dtype, attn)
    model = model.to(device)
    backend = LocalBackend(model, tokenizer, config, model_id=path.name, fingerprint=fingerprint)
    if mode in ("int8", "int4"):
        line = quant_choice.choose(model, mode, backend.time_quant_steps, progress=progress)
    elif why_not is not None:
        line = f"weights: the file's tensors dequantized to float ({why_not})"
    else:  # a file with float projections: the float model, its block tensors swapped in
        counts = gguf_file.swap_in_blocks(
            model, reader, architecture, int8_activations=mode == "gguf-q8"
        )
        line = f"weights {mode}: {gguf_file.describe_counts(counts)}"
    return backend.ready(line, device, progress, started)


def _why_not_blocks(
    path: Path, architecture: str, mode: str, device: str, dtype: torch.dtype, progress: Progress
) -> str | None:
    """Why the file's linears stay float in this weight mode (the start-up log says it), or
    None where they become its blocks; raises where a block mode is forced and cannot run."""
    if mode in ("int8", "int4"):
        return f"then quantized to {mode}"
    if mode == "none":
        return "CHAT_ENGINE quant=none"
    if architecture not in gguf_file.BLOCK_ARCHITECTURES:
        return (
            f"{architecture} runs transformers' forward; blocks are read for "
            f"{', '.join(gguf_file.BLOCK_ARCHITECTURES)}"
        )
    why = "" if device == "cpu" else f"blocks run on the CPU, not {device}"
    if not why and dtype != torch.float32:
        why = f"blocks compute in float32, not {dtype}"
    if not why and blockquant.kernels(progress) is None:
        why = f"the block kernels are unavailable: {blockquant.failure()}"
    if why and mode != "auto":
        raise RuntimeError(f"CHAT_ENGINE quant={mode} cannot run {path.name}: {why}")
    return why or None
