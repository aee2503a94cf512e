"""The model built around kept GGUF blocks: its float linears are never materialised.

Loading the float model and then swapping its linears for the GGUF file's blocks (gguf_blocks.py)
allocates the 538 MB of fp32 projections only to free them: the serving process peaked at 1.3 GB
for a model that runs in under 1 GB. When a block mode is already decided (forced, or `auto`'s
choice remembered for this machine) and an earlier start kept the file's blocks beside the model,
the model is instead built on torch's meta device, its projections and LM head replaced by those
blocks, and only the tensors left (the embedding table and the norms, 115 MB) read from the
folder's safetensors. The result computes exactly what the float-then-swapped model computes
(tests/test_blockquant.py compares them).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .gguf_blocks import kept_block_layers
from .quantized import projections

log = logging.getLogger(__name__)


def load_around_blocks(
    folder: str | Path,
    *,
    gguf_path: str | Path,
    dtype: torch.dtype,
    attn_implementation: str | None,
    int8_activations: bool = False,
) -> tuple[nn.Module, int] | None:
    """(model in eval mode on the CPU, layers from the kept blocks), or None where no blocks are
    kept for this folder and file, or they do not cover every projection (the caller then loads
    the float model and swaps, which reads and keeps them)."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    folder = Path(folder)
    blocks = kept_block_layers(gguf_path, folder)
    if not blocks:
        return None
    config = AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=attn_implementation
        )
    model.config._name_or_path = str(folder)
    linears = projections(model)
    if {qualified for *_, qualified in linears} != set(blocks):
        log.info("the kept GGUF blocks do not cover this model's projections: loading it whole")
        return None
    for parent, name, _child, _linear, qualified in linears:
        layer = blocks[qualified]
        layer.int8_activations = int8_activations
        setattr(parent, name, layer)
    wanted = set(still_meta(model))
    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name in wanted:
                    state[name] = weights.get_tensor(name).to(dtype)
    model.load_state_dict(state, strict=False, assign=True)
    rebuild_rotary(model)
    left = list(still_meta(model))
    if left:
        log.info("no weights in %s for %s: loading the model whole", folder, ", ".join(left[:3]))
        return None
    generation = folder / "generation_config.json"
    if generation.exists():
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
    return model.eval(), len(blocks)


def still_meta(model: nn.Module) -> dict[str, torch.Size]:
    """The parameters and buffers not materialised yet, with their shapes."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return {name: tensor.shape for name, tensor in tensors if tensor.is_meta}


def rebuild_rotary(model: Any) -> None:
    """The rotary embedding's frequencies are computed buffers, not weights: built again on the
    CPU (they were made on the meta device with the rest)."""
    inner = getattr(model, "model", None)
    rotary = getattr(inner, "rotary_emb", None)
    if inner is not None and rotary is not None and any(b.is_meta for b in rotary.buffers()):
        inner.rotary_emb = type(rotary)(config=model.config)
