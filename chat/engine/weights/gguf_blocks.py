"""The GGUF file's own blocks, read into linears: Q4_1 projections and a Q8_0 LM head.

The bundled model ships as a GGUF file whose projections are Q4_1 blocks (`w = d * q + m`, 32
weights a block) and whose token embedding, tied to the LM head, is Q8_0. Rather than re-quantize
a dequantized copy, the "gguf" modes compute those very bytes (blockquant.py) and int4 takes the
Q4_1 blocks as torch's int4 parts (quantized.py): bit for bit what llama.cpp reads. A file that
is not this model's (its first and last layers checked against the loaded weights) is not used.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch
from torch import nn

from . import blockquant
from .quantized import GROUP, QuantLinear, int4_parts, int4_weight, output_linear, projections

log = logging.getLogger(__name__)

GGML_Q4_1 = 3
Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles
# A GGUF block dequantized must match the loaded weight this closely (the converted model is the
# same blocks rounded to bf16: relative error <= 2**-8), or the file is not this model's.
GGUF_MATCH_TOLERANCE = 1e-2


def quantize_blocks(
    model: nn.Module, *, gguf_path: str | Path | None = None, int8_activations: bool = False
) -> tuple[list[tuple[nn.Module, str, nn.Module]], int]:
    """Swap every bias-free nn.Linear for a BlockQuantLinear (blockquant.py): "gguf" mode, or
    "gguf-q8" with `int8_activations`.

    Projections take the GGUF file's Q4_1 blocks where they are this model's (else are quantized
    to Q4_1 from the weights); the LM head takes the file's Q8_0 token embedding when the head is
    tied to it (else Q8_0 from the weights). Returns the undo list and how many layers came from
    the file.
    """
    output = output_linear(model)
    from_file = gguf_block_layers(gguf_path, model) if gguf_path is not None else {}
    undo = []
    for parent, name, child, linear, qualified in projections(model):
        layer = from_file.get(qualified)
        if layer is None and (linear is output or linear.in_features % GROUP):
            layer = blockquant.BlockQuantLinear.q8_0(*blockquant.q8_0_parts(linear.weight))
        elif layer is None:
            q, d, m = int4_parts(linear.weight)
            layer = blockquant.BlockQuantLinear.q4_1(q, d, m)
        layer.int8_activations = int8_activations
        setattr(parent, name, layer)
        undo.append((parent, name, child))
    return undo, len(from_file)


def gguf_block_layers(gguf_path: str | Path, model: nn.Module) -> dict[str, nn.Module]:
    """BlockQuantLinears holding the GGUF file's bytes as stored, by module name (see
    `_read_gguf_block_layers`), kept in the model folder after the first read.

    gguf's reader parses the whole file's metadata (the tokenizer's 100,000 strings) in Python,
    seconds at every start; the kept copy loads in a fraction of one. Its name carries the GGUF
    file's and the folder's weights' sizes and times, so a changed file is read afresh.
    """
    cache = _block_cache_path(gguf_path, model)
    kept = _read_kept(cache)
    if kept is not None:
        return kept
    layers = _read_gguf_block_layers(gguf_path, model)
    if cache is not None and layers:
        parts = {
            name: {
                "kind": layer.kind,
                "in": layer.in_features,
                "out": layer.out_features,
                "qs": layer.qs,
                "d": layer.d,
                "m": layer.m,
            }
            for name, layer in layers.items()
        }
        partial = cache.with_suffix(".partial")
        try:
            torch.save(parts, partial)
            partial.replace(cache)
        except OSError as error:
            log.info("GGUF blocks not kept (%s): read again at the next start", error)
    return layers


def kept_block_layers(gguf_path: str | Path, folder: str | Path) -> dict[str, nn.Module] | None:
    """The blocks an earlier start read from `gguf_path` for the model in `folder` and kept beside
    it, by module name; None where none are kept (or they are unreadable)."""
    return _read_kept(block_cache_path(gguf_path, folder))


def _read_kept(cache: Path | None) -> dict[str, nn.Module] | None:
    if cache is None or not cache.exists():
        return None
    try:
        saved = torch.load(cache, weights_only=True)
        return {
            name: blockquant.BlockQuantLinear(
                part["kind"], part["in"], part["out"], part["qs"], part["d"], part["m"]
            )
            for name, part in saved.items()
        }
    except Exception as error:  # a torn or foreign file: the caller reads the GGUF again
        log.info("the kept GGUF blocks %s are unreadable (%s)", cache, error)
        return None


def _block_cache_path(gguf_path: str | Path, model: nn.Module) -> Path | None:
    return block_cache_path(gguf_path, str(getattr(model.config, "_name_or_path", "")))


def block_cache_path(gguf_path: str | Path, folder: str | Path) -> Path | None:
    """Where the blocks read from `gguf_path` for the model in `folder` are kept: named after the
    file's and the folder's weights' sizes and times, so a changed file is read afresh."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    identity = [Path(gguf_path)] + sorted(folder.glob("*.safetensors"))
    stamp = "|".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in identity)
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    return folder / f"gguf-blocks-{digest}.pt"


def _read_gguf_block_layers(gguf_path: str | Path, model: nn.Module) -> dict[str, nn.Module]:
    """BlockQuantLinears holding the GGUF file's bytes as stored, by module name.

    Q4_1 projections of a Llama-architecture file (rows of q/k un-permuted), and the Q8_0 token
    embedding for a head tied to it. The first and last layers and the head are checked against
    the loaded weights; a file that does not match gives {} (the caller quantizes the weights).
    """
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    field = reader.fields.get("general.architecture")
    if field is None or bytes(field.parts[-1]).decode() != "llama":
        return {}
    config = model.config
    modules = {q: lin for _, _, _, lin, q in projections(model)}
    output = output_linear(model)
    layers: dict[str, nn.Module] = {}
    for tensor in reader.tensors:
        pieces = tensor.name.split(".")
        if tensor.name == "token_embd.weight" and tensor.tensor_type == blockquant.GGML_Q8_0:
            if output is None or not _tied(model, output):
                continue
            qualified, linear = next((q, lin) for q, lin in modules.items() if lin is output)
            block_bytes, check = blockquant.Q8_0_BLOCK_BYTES, True
        elif (
            len(pieces) == 4
            and pieces[0] == "blk"
            and pieces[2] in LLAMA_NAMES
            and tensor.tensor_type == GGML_Q4_1
        ):
            qualified = f"model.layers.{pieces[1]}.{LLAMA_NAMES[pieces[2]]}"
            linear = modules.get(qualified)
            if linear is None:
                return {}
            block_bytes = Q4_1_BLOCK_BYTES
            check = pieces[1] in ("0", str(config.num_hidden_layers - 1))
        else:
            continue
        out_features, in_features = linear.weight.shape
        data = torch.from_numpy(tensor.data.copy())
        if tuple(data.shape) != (out_features, in_features // GROUP * block_bytes):
            return {}
        blocks = data.reshape(out_features, in_features // GROUP, block_bytes)
        d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
        if block_bytes == Q4_1_BLOCK_BYTES:
            m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()
            qs = blocks[..., 4:].reshape(out_features, -1)
            if pieces[2] in ("attn_q", "attn_k"):
                heads = (
                    config.num_attention_heads
                    if pieces[2] == "attn_q"
                    else config.num_key_value_heads
                )
                order = unpermute_rows(out_features, heads)
                qs, d, m = qs[order], d[order], m[order]
            layer = blockquant.BlockQuantLinear("q4_1", in_features, out_features, qs, d, m)
        else:
            qs = blocks[..., 2:].contiguous().view(torch.int8).reshape(out_features, in_features)
            layer = blockquant.BlockQuantLinear("q8_0", in_features, out_features, qs, d)
        if check:
            reference = linear.weight.detach().float()
            error = (layer.weight_float() - reference).abs().max()
            if error > GGUF_MATCH_TOLERANCE * reference.abs().max():
                log.info(
                    "GGUF %s does not match %s: quantizing the weights", tensor.name, qualified
                )
                return {}
        layers[qualified] = layer
    return layers


def _tied(model: nn.Module, linear: nn.Module) -> bool:
    embedding = model.get_input_embeddings()
    return embedding is not None and embedding.weight.data_ptr() == linear.weight.data_ptr()


# GGUF tensor name (per layer) -> transformers Llama module name.
LLAMA_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def q4_1_nibbles(
    data: torch.Tensor, in_features: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GGUF Q4_1 rows (uint8 [out, in / 32 * 20]) -> (q [out, in] 0..15, d, m [out, in / 32])."""
    out_features = data.shape[0]
    blocks = data.reshape(out_features, in_features // GROUP, Q4_1_BLOCK_BYTES)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()
    nibbles = blocks[..., 4:].to(torch.int32)
    q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1)  # elements 0..15, then 16..31
    return q.reshape(out_features, in_features), d, m


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """llama.cpp stores q/k rows permuted for its rotary layout; the row order transformers uses.

    The inverse of convert_hf_to_gguf's `permute`, as transformers' GGUF loader applies it.
    """
    index = torch.arange(rows)
    return index.reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(rows)


def gguf_q4_1_parts(
    gguf_path: str | Path, model: nn.Module
) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The GGUF file's Q4_1 projections as 4-bit parts (q, d, m), by module name, checked
    against `model`.

    Only a Llama-architecture file whose blocks dequantize to the loaded weights is used: for any
    other file, or one that does not match, this returns {} and the caller re-quantizes.
    """
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    field = reader.fields.get("general.architecture")
    if field is None or bytes(field.parts[-1]).decode() != "llama":
        return {}
    config = model.config
    modules = {q: lin for _, _, _, lin, q in projections(model)}
    parts: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for tensor in reader.tensors:
        pieces = tensor.name.split(".")
        if len(pieces) != 4 or pieces[0] != "blk" or pieces[2] not in LLAMA_NAMES:
            continue
        if tensor.tensor_type != GGML_Q4_1:
            continue
        qualified = f"model.layers.{pieces[1]}.{LLAMA_NAMES[pieces[2]]}"
        linear = modules.get(qualified)
        if linear is None:
            return {}
        out_features, in_features = linear.weight.shape
        data = torch.from_numpy(tensor.data.copy())
        if tuple(data.shape) != (out_features, in_features // GROUP * Q4_1_BLOCK_BYTES):
            return {}
        q, d, m = q4_1_nibbles(data, in_features)
        if pieces[2] in ("attn_q", "attn_k"):
            heads = (
                config.num_attention_heads if pieces[2] == "attn_q" else config.num_key_value_heads
            )
            order = unpermute_rows(out_features, heads)
            q, d, m = q[order], d[order], m[order]
        if pieces[1] in ("0", str(config.num_hidden_layers - 1)):
            # Spot-check the first and last layers: the blocks must be this model's weights.
            reference = linear.weight.detach().float()
            error = (int4_weight(q, d, m) - reference).abs().max()
            if error > GGUF_MATCH_TOLERANCE * reference.abs().max():
                log.info("GGUF %s does not match %s: re-quantizing", tensor.name, qualified)
                return {}
        parts[qualified] = (q, d, m)
    return parts


def gguf_int4_layers(
    gguf_path: str | Path, model: nn.Module, compute_dtype: torch.dtype = torch.float32
) -> dict[str, QuantLinear]:
    """QuantLinears from the GGUF file's Q4_1 blocks (gguf_q4_1_parts), by module name."""
    return {
        name: QuantLinear.from_nibbles(*parts, compute_dtype)
        for name, parts in gguf_q4_1_parts(gguf_path, model).items()
    }
