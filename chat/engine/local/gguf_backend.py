"""A LocalBackend for a model that is one GGUF file (CHAT_MODEL_PATH=/path/model.gguf).

The file is checked first (weights/gguf_file.py: an architecture transformers cannot build or a
tensor type with no kernel is one start-up error), then transformers builds the config, the
tokenizer with its chat template and the float model from the file's metadata and tensors. For
Llama and Qwen2 the linears then become the file's own blocks (the weight mode `gguf`, or
`gguf-q8`; `auto` takes the blocks where the kernels build), so the fused decode step runs them;
another architecture, `quant=none`, or a CPU without the kernels under `auto` keeps the float
model and transformers' forward. `int8` and `int4` quantize the float model as for a folder.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from torch import nn

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
    architecture = gguf_file.check_runnable(path)
    fingerprint = weights_fingerprint(path, config.data_dir)
    threads = ThreadPlan.configured(config.threads, config.decode_threads)
    torch.set_num_threads(threads.prefill)
    device = pick_device(config.device)
    dtype = pick_dtype(config.dtype, device)
    started = time.perf_counter()
    progress(f"Loading {path.name} ({architecture}, {dtype}, {device}, {threads.describe()})...")
    attn = attention.register() if device == "cpu" else None
    model, tokenizer = gguf_file.load_model_and_tokenizer(path, dtype, attn)
    model = model.to(device)
    backend = LocalBackend(model, tokenizer, config, model_id=path.name, fingerprint=fingerprint)
    quant_line = _weights(model, path, architecture, config, device, backend, progress)
    return backend.ready(quant_line, device, progress, started)


def _weights(
    model: nn.Module,
    path: Path,
    architecture: str,
    config: EngineConfig,
    device: str,
    backend: LocalBackend,
    progress: Progress,
) -> str:
    """Apply the weight mode a GGUF file runs in; the start-up log's line for it."""
    mode = config.quant
    if mode in ("int8", "int4"):
        return quant_choice.choose(model, mode, backend.time_quant_steps, progress=progress)
    if mode == "none":
        return "weights: the file's tensors dequantized to float (CHAT_ENGINE quant=none)"
    if architecture not in gguf_file.BLOCK_ARCHITECTURES:
        return (
            f"weights: the file's tensors dequantized to float ({architecture} runs transformers' "
            f"forward; blocks are read for {', '.join(gguf_file.BLOCK_ARCHITECTURES)})"
        )
    why = "" if device == "cpu" else f"blocks run on the CPU, not {device}"
    if not why and model.dtype != torch.float32:
        why = f"blocks compute in float32, not {model.dtype}"
    if not why and blockquant.kernels(progress) is None:
        why = f"the block kernels are unavailable: {blockquant.failure()}"
    if why and mode != "auto":
        raise RuntimeError(f"CHAT_ENGINE quant={mode} cannot run {path.name}: {why}")
    if why:
        return f"weights: the file's tensors dequantized to float ({why})"
    counts = gguf_file.swap_in_blocks(model, path, architecture, int8_activations=mode == "gguf-q8")
    return f"weights {mode}: {gguf_file.describe_counts(counts)}"
