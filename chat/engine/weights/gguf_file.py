"""A GGUF file as the model: CHAT_MODEL_PATH may name a `.gguf` file instead of a folder.

Architecture, sizes, rope settings, tokenizer and chat template come from the file's own
metadata, through transformers' GGUF support (`from_pretrained(folder, gguf_file=name)` builds the
config and the tokenizer). For Llama and Qwen2, the architectures the fused decode step
computes, every projection and the LM head are the file's own blocks as stored (blockquant.py:
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, per tensor, so mixed files work as they come;
Q5_0, Q4_K and Q6_K widened to Q8_0's and Q4_1's layouts, the same weights, for the faster
kernels): the model is built around them on the meta device and only its other tensors are
dequantized (`load_around_blocks`). Where a projection is F32/F16/BF16, transformers builds the
float model with every tensor dequantized (q/k un-permuted) and the block tensors are swapped in
(`swap_in_blocks`); the float ones stay the linears transformers built. Any other architecture
transformers can build runs its float model through transformers' forward. A file with an
architecture transformers cannot build, or a tensor type with no kernel here, is refused before
anything loads, with one error naming what is not supported.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .blockquant import KIND_OF_TYPE, SPLIT_KINDS, WIDENED_AS, BlockQuantLinear
from .gguf_blocks import LLAMA_NAMES, unpermute_rows

log = logging.getLogger(__name__)

# GGML type ids of the float tensors, which keep transformers' float linears.
FLOAT_TYPES = {0: "F32", 1: "F16", 30: "BF16"}
# The architectures whose linears become the file's blocks (the fused step's decoders).
BLOCK_ARCHITECTURES = ("llama", "qwen2")
# A block dequantized must be the weight transformers loaded from the same bytes, to fp32
# rounding: a larger difference is a mapping error (a wrong tensor, rows in the wrong order).
MATCH_TOLERANCE = 1e-5


class UnsupportedModelFile(RuntimeError):
    """A GGUF file this engine cannot run: the message names the architecture or tensor types."""


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def check_runnable(path: str | Path) -> tuple[str, Any]:
    """The file's architecture and its `gguf.GGUFReader` (2 s of parsing on the bundled model's
    metadata: the loaders take it rather than parse the file again), after checking this engine
    can run it; raises UnsupportedModelFile (one error naming everything unsupported) or
    FileNotFoundError."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CHAT_MODEL_PATH={path}: no such GGUF file")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as error:  # not GGUF at all, or torn: say so once, not a traceback
        raise UnsupportedModelFile(f"{path.name} is not a readable GGUF file: {error}") from error
    architecture = str(_field(reader, "general.architecture") or "")
    problems = []
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        problems.append(
            f"architecture {architecture or '(none named)'!r} is not one transformers can build from "
            "a GGUF file"
        )
    unsupported: dict[str, list[str]] = {}
    for tensor in reader.tensors:
        kind = int(tensor.tensor_type)
        if kind not in FLOAT_TYPES and kind not in KIND_OF_TYPE:
            unsupported.setdefault(tensor.tensor_type.name, []).append(tensor.name)
    if unsupported:
        types = ", ".join(
            f"{name} ({len(names)} tensors, e.g. {names[0]})" for name, names in unsupported.items()
        )
        problems.append(f"tensor type {types} has no kernel here")
    if problems:
        supported = ", ".join([*FLOAT_TYPES.values(), *(k.upper() for k in KIND_OF_TYPE.values())])
        raise UnsupportedModelFile(
            f"{path.name} cannot run here: {'; '.join(problems)} (tensor types run: {supported})"
        )
    return architecture, reader


def load_model_and_tokenizer(
    path: str | Path, dtype: torch.dtype, attn_implementation: str | None
) -> tuple[nn.Module, Any]:
    """transformers' float model and tokenizer, both built from the file's own metadata."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent),
        gguf_file=path.name,
        dtype=dtype,
        attn_implementation=attn_implementation,
    ).eval()
    return model, tokenizer


def _linear_role(name: str, tied: bool) -> str | None:
    """The role of the linear the file's tensor `name` is the weight of: "output" for the LM
    head (`output`, or the token embedding where the head is tied to it), "N.attn_q" and so on
    for layer N's projections; None for any other tensor (the embedding's lookup table, norms,
    biases)."""
    pieces = name.split(".")
    if name == "output.weight" or (name == "token_embd.weight" and tied):
        return "output"
    if (
        len(pieces) == 4
        and pieces[0] == "blk"
        and pieces[2] in LLAMA_NAMES
        and pieces[3] == "weight"
    ):
        return f"{pieces[1]}.{pieces[2]}"
    return None


def _parent_of(model: nn.Module, role: str) -> tuple[nn.Module, str]:
    """(module, attribute) holding the linear of `role` (`_linear_role`)."""
    if role == "output":
        return model, "lm_head"
    layer, projection = role.split(".")
    part, attribute = LLAMA_NAMES[projection].split(".")
    return getattr(model.model.layers[int(layer)], part), attribute


def _block(
    tensor: Any,
    linear: nn.Module,
    role: str,
    architecture: str,
    config: Any,
    bias: torch.Tensor | None,
    int8_activations: bool,
) -> BlockQuantLinear:
    """The file's blocks of `tensor` as the linear of `role`, rows in transformers' order."""
    out_features, in_features = linear.weight.shape
    rows = torch.from_numpy(tensor.data.copy()).view(torch.uint8).reshape(out_features, -1)
    projection = role.rsplit(".", 1)[-1]
    if architecture == "llama" and projection in ("attn_q", "attn_k"):
        # llama.cpp stores Llama's q/k rows in its rotary order; transformers un-permutes them.
        q = projection == "attn_q"
        heads = config.num_attention_heads if q else config.num_key_value_heads
        rows = rows[unpermute_rows(out_features, heads)]
    layer = BlockQuantLinear.from_gguf(int(tensor.tensor_type), rows, in_features, bias=bias)
    # llama.cpp's int8 activations exist for the split kinds only; the raw ones stay fp32.
    layer.int8_activations = int8_activations and layer.kind in SPLIT_KINDS
    return layer


def load_around_blocks(
    path: str | Path,
    reader: Any,
    architecture: str,
    dtype: torch.dtype,
    attn_implementation: str | None,
    *,
    int8_activations: bool = False,
) -> tuple[nn.Module, Any, dict[str, int]] | None:
    """(model, tokenizer, linears per type) for a Llama or Qwen2 file, its float linears never
    built: the model is made on torch's meta device from the file's config, every projection
    and the LM head become the file's blocks, and only the rest (the embedding table, norms,
    Qwen2's biases) is dequantized, by the `gguf` package. Loading transformers' float model
    first dequantizes every weight to fp32, 4 bytes a weight: about 32 GB for an 8B model whose
    Q4_K_M file is 4.9 GB. None where a projection is stored as floats (the caller loads the
    float model whole, as for an F16 file)."""
    import gguf
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    from .around_blocks import rebuild_rotary, still_meta

    path = Path(path)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    tied = "output.weight" not in tensors
    roles = {name: role for name in tensors if (role := _linear_role(name, tied)) is not None}
    if any(int(tensors[name].tensor_type) in FLOAT_TYPES for name in roles):
        return None  # decided before the config and the model are built
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=attn_implementation
        )
    hf_names = get_gguf_hf_weights_map(model, TensorProcessor())
    # Qwen2's q/k/v biases go into their blocks; everything else not a block is a float tensor.
    biases = {name[: -len("bias")] + "weight": name for name in tensors if name.endswith(".bias")}
    state: dict[str, torch.Tensor] = {}

    def floats(name: str, shape: torch.Size) -> torch.Tensor:
        tensor = tensors[name]
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        return torch.from_numpy(values.copy()).reshape(shape).to(dtype)

    counts: Counter[str] = Counter()
    for name, role in roles.items():
        parent, attribute = _parent_of(model, role)
        linear = getattr(parent, attribute)
        bias = floats(biases[name], linear.weight.shape[:1]) if name in biases else None
        block = _block(tensors[name], linear, role, architecture, config, bias, int8_activations)
        setattr(parent, attribute, block)
        counts[tensors[name].tensor_type.name.lower()] += 1  # as stored, whatever computes it
    wanted = still_meta(model)
    for name in tensors:
        hf_name = hf_names.get(name)
        head_only = name in roles and not (tied and name == "token_embd.weight")
        if head_only or name in biases.values() or hf_name not in wanted:
            continue  # a block (a tied head's is also the embedding's table), a bias in its
            # block, or a tensor transformers does not use
        state[hf_name] = floats(name, wanted[hf_name])
    model.load_state_dict(state, strict=False, assign=True)
    rebuild_rotary(model)
    left = list(still_meta(model))
    if left:
        log.info("%s holds no tensor for %s: loading the float model whole", path.name, left[0])
        return None
    model.config._name_or_path = str(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tokenizer, dict(counts)


def swap_in_blocks(
    model: nn.Module, reader: Any, architecture: str, *, int8_activations: bool = False
) -> dict[str, int]:
    """Replace each projection and the LM head of a Llama or Qwen2 `model` (built from the file
    `reader` reads) with the file's blocks for it, as stored; returns how many linears each
    type took.

    Float tensors keep their linear. Every block dequantized is checked against the weight
    transformers loaded from the same bytes (MATCH_TOLERANCE): a mismatch is a bug, not a file
    to fall back from, so it raises.
    """
    if architecture not in BLOCK_ARCHITECTURES:
        raise ValueError(f"architecture {architecture!r}: no block path (transformers' forward)")
    inner = model.model
    tied = model.lm_head.weight.data_ptr() == inner.embed_tokens.weight.data_ptr()
    counts: Counter[str] = Counter()
    for tensor in reader.tensors:
        role = _linear_role(tensor.name, tied)
        if role is None or int(tensor.tensor_type) in FLOAT_TYPES:
            continue  # the embedding's table and float linears stay what transformers built
        parent, attribute = _parent_of(model, role)
        linear = getattr(parent, attribute)
        if type(linear) is not nn.Linear:
            raise ValueError(f"{tensor.name}: expected a linear, found {type(linear).__name__}")
        block = _block(
            tensor, linear, role, architecture, model.config, linear.bias, int8_activations
        )
        reference = linear.weight.detach().float()
        error = (block.weight_float() - reference).abs().max()
        if error > MATCH_TOLERANCE * max(reference.abs().max().item(), 1e-30):
            raise ValueError(f"{tensor.name}'s blocks do not match the weight transformers loaded")
        setattr(parent, attribute, block)
        counts[tensor.tensor_type.name.lower()] += 1  # as stored, whatever computes it
    return dict(counts)


def describe_counts(counts: dict[str, int]) -> str:
    """ "211 linears from the file's blocks (Q4_K 60, Q6_K 31, ...)"."""
    total = sum(counts.values())
    kinds = ", ".join(f"{kind.upper()} {count}" for kind, count in sorted(counts.items()))
    widened = "".join(
        f"; {kind.upper()} computed as {layout.upper()}, the same weights"
        for kind, layout in WIDENED_AS.items()
        if kind in counts
    )
    return (
        f"{total} linears from the file's blocks ({kinds}{widened})"
        if total
        else "no linear in blocks"
    )
