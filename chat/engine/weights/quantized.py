"""Weight-only quantized linears: every projection and the LM head read 4 or 8 bits a weight.

A decode step of a small model on a CPU reads every weight once per step, so its speed is set by
how many bytes the weights take. fp32 SmolLM2-135M is about 540 MB a token; int8 weights are a
quarter of that, int4 an eighth. Activations, norms, attention and the KV cache stay in the
model's dtype; only the matmuls read packed weights, through torch's own CPU kernels:

- int8: `aten._weight_int8pack_mm`, one symmetric int8 scale per output row.
- int4: `aten._weight_int4pack_mm_for_cpu`, asymmetric 4-bit in groups of 32 along the input,
  `w = (q - 8) * scale + zero`. That is exactly GGUF's Q4_1 block (`w = d * q + m`, 32 weights a
  block), so the bundled model's projections are loaded from the GGUF file's own blocks, bit for
  bit what llama.cpp reads, rather than re-quantized from a dequantized copy.

The LM head (tied to the embeddings in SmolLM2, Q8_0 in the GGUF) is int8 per row in both modes;
the embedding lookup keeps the model's own table. `auto` (backend.py) times a decode step per
candidate at load and keeps the fastest whose quality was measured acceptable
(docs/engine.md, bench/scripts/quant_trial.py).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import blockquant
from .start_choices import StartChoices, decisive
from .weight_major import WeightMajorLinear

log = logging.getLogger(__name__)

MODES = ("auto", "none", "int8", "int4", "gguf", "gguf-q8")
GROUP = 32  # int4 group size along the input: GGUF's Q4_1/Q8_0 block
GGML_Q4_1 = 3
Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles
# A GGUF block dequantized must match the loaded weight this closely (the converted model is the
# same blocks rounded to bf16: relative error <= 2**-8), or the file is not this model's.
GGUF_MATCH_TOLERANCE = 1e-2


def kernels_available() -> bool:
    """Whether this torch build has the CPU kernels (torch >= 2.5 or so)."""
    return hasattr(torch.ops.aten, "_weight_int8pack_mm") and hasattr(
        torch.ops.aten, "_weight_int4pack_mm_for_cpu"
    )


def int8_parts(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [out, in], scale [out]) with w ~ q * scale: symmetric, one scale per row."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return q, scales


def int4_parts(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [out, in] 0..15, scale, low [out, in / GROUP]) with w ~ q * scale + low per group."""
    w = weight.detach().float()
    out_features, in_features = w.shape
    groups = w.reshape(out_features, in_features // GROUP, GROUP)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=1e-12)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    return q.reshape(out_features, in_features), scale, low


def int4_weight(q: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """The float32 weight [out, in] that 4-bit parts stand for."""
    out_features, in_features = q.shape
    groups = q.reshape(out_features, -1, GROUP).float() * scale[..., None] + low[..., None]
    return groups.reshape(out_features, in_features)


class QuantLinear(nn.Module):
    """A bias-free linear whose weight is int8 per row or int4 in groups of GROUP (see module doc).

    `compute_dtype` is the activation dtype the kernel runs in; input and output keep the caller's.
    """

    def __init__(
        self,
        kind: str,
        in_features: int,
        out_features: int,
        weight: torch.Tensor,
        scales: torch.Tensor,
        compute_dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.kind = kind
        self.in_features = in_features
        self.out_features = out_features
        self.compute_dtype = compute_dtype
        self.register_buffer("qweight", weight)
        self.register_buffer("scales", scales.to(compute_dtype))

    @classmethod
    def int8(cls, weight: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> QuantLinear:
        """Symmetric int8, one scale per output row."""
        q, scales = int8_parts(weight)
        return cls("int8", q.shape[1], q.shape[0], q, scales, compute_dtype)

    @classmethod
    def int4(cls, weight: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> QuantLinear:
        """Asymmetric 4-bit per group of GROUP inputs (min/max), the way Q4_1 quantizes."""
        return cls.from_nibbles(*int4_parts(weight), compute_dtype)

    @classmethod
    def from_nibbles(
        cls,
        q: torch.Tensor,
        scale: torch.Tensor,
        low: torch.Tensor,
        compute_dtype: torch.dtype = torch.float32,
    ) -> QuantLinear:
        """From 4-bit values `q` [out, in] (0..15) with `w = q * scale + low` per group [out, groups]."""
        out_features, in_features = q.shape
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            q.to(torch.int32).contiguous(), 1
        )
        # The kernel's form: [groups, out, 2] of (scale, zero) with w = (q - 8) * scale + zero.
        scales = torch.stack([scale, low + 8 * scale], dim=-1).transpose(0, 1).contiguous()
        return cls("int4", in_features, out_features, packed, scales, compute_dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.reshape(-1, self.in_features)
        if rows.dtype != self.compute_dtype:
            rows = rows.to(self.compute_dtype)
        if self.kind == "int8":
            out = torch.ops.aten._weight_int8pack_mm(rows, self.qweight, self.scales)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                rows.contiguous(), self.qweight, GROUP, self.scales
            )
        if out.dtype != hidden.dtype:
            out = out.to(hidden.dtype)
        return out.reshape(*hidden.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.kind}, in_features={self.in_features}, out_features={self.out_features}"


def _projections(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module, nn.Linear, str]]:
    """(parent, attribute, child, linear, qualified name) of every bias-free nn.Linear.

    A weight-major wrapper (weight_major.py) counts as the linear it wraps: it is the child that
    is swapped out and put back.
    """
    found = []
    for parent_name, parent in model.named_modules():
        if isinstance(parent, WeightMajorLinear):
            continue
        for name, child in parent.named_children():
            linear = child.linear if isinstance(child, WeightMajorLinear) else child
            if type(linear) is nn.Linear and linear.bias is None:
                qualified = f"{parent_name}.{name}" if parent_name else name
                found.append((parent, name, child, linear, qualified))
    return found


def quantize(
    model: nn.Module,
    mode: str,
    *,
    gguf_blocks: dict[str, QuantLinear] | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[list[tuple[nn.Module, str, nn.Module]], int]:
    """Swap every bias-free nn.Linear for a QuantLinear in `mode` ("int8" or "int4").

    In int4 mode a projection found in `gguf_blocks` (by qualified module name) takes those
    blocks; the LM head is int8 in both modes (a tied one keeps sharing its weight with the
    embedding, which still looks rows up in it). Returns (parent, name, original) per swapped
    layer, for `restore`, and how many layers came from GGUF blocks.
    """
    if mode not in ("int8", "int4"):
        raise ValueError(f"quantize mode {mode!r}: use int8 or int4")
    output = _output_linear(model)
    undo, from_gguf = [], 0
    for parent, name, child, linear, qualified in _projections(model):
        if mode == "int8" or linear is output or linear.in_features % GROUP:
            layer = QuantLinear.int8(linear.weight, compute_dtype)
        elif gguf_blocks and qualified in gguf_blocks:
            layer = gguf_blocks[qualified]
            from_gguf += 1
        else:
            layer = QuantLinear.int4(linear.weight, compute_dtype)
        setattr(parent, name, layer)
        undo.append((parent, name, child))
    return undo, from_gguf


def restore(undo: list[tuple[nn.Module, str, nn.Module]]) -> None:
    """Put back the layers `quantize` swapped out."""
    for parent, name, original in undo:
        setattr(parent, name, original)


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
    output = _output_linear(model)
    from_file = gguf_block_layers(gguf_path, model) if gguf_path is not None else {}
    undo = []
    for parent, name, child, linear, qualified in _projections(model):
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
    if cache is not None and cache.exists():
        try:
            saved = torch.load(cache, weights_only=True)
            return {
                name: blockquant.BlockQuantLinear(
                    part["kind"], part["in"], part["out"], part["qs"], part["d"], part["m"]
                )
                for name, part in saved.items()
            }
        except Exception as error:  # a torn or foreign file: read the GGUF again
            log.info("re-reading the GGUF blocks: %s unreadable (%s)", cache, error)
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


def _block_cache_path(gguf_path: str | Path, model: nn.Module) -> Path | None:
    folder = Path(str(getattr(model.config, "_name_or_path", "")))
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
    modules = {q: lin for _, _, _, lin, q in _projections(model)}
    output = _output_linear(model)
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
                order = _unpermute_rows(out_features, heads)
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


# -- GGUF Q4_1 blocks ------------------------------------------------------------------------

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


def _unpermute_rows(rows: int, heads: int) -> torch.Tensor:
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
    modules = {q: lin for _, _, _, lin, q in _projections(model)}
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
            order = _unpermute_rows(out_features, heads)
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


def simulate(model: nn.Module, mode: str, *, gguf_path: str | Path | None = None) -> list[Any]:
    """Give every projection the float weight `mode` would compute with, in plain nn.Linears.

    For measuring a mode's quality (perplexity, eos, pass rates) on a CPU whose kernels for it are
    slow: the same weights, computed by the float matmul (logits agree with the kernels' within
    the tolerance tests/test_quantized.py checks). A tied LM head gets a weight of its own, so the
    embedding keeps looking up the float table, as in the real mode. Returns the undo list.
    """
    if mode not in ("int8", "int4"):
        raise ValueError(f"simulate mode {mode!r}: use int8 or int4")
    output = _output_linear(model)
    gguf = gguf_q4_1_parts(gguf_path, model) if gguf_path and mode == "int4" else {}
    undo = []
    for parent, name, child, linear, qualified in _projections(model):
        if mode == "int8" or linear is output or linear.in_features % GROUP:
            q, scales = int8_parts(linear.weight)
            weight = q.float() * scales[:, None]
        elif qualified in gguf:
            weight = int4_weight(*gguf[qualified])
        else:
            weight = int4_weight(*int4_parts(linear.weight))
        layer = nn.Linear(linear.in_features, linear.out_features, bias=False)
        layer.weight = nn.Parameter(weight.to(linear.weight.dtype), requires_grad=False)
        setattr(parent, name, layer)
        undo.append((parent, name, child))
    return undo


# `auto` keeps a mode only when its timed decode steps beat the model as loaded by this margin.
MARGIN = 0.9
# A kernel this much slower than the float matmul on one row of the largest projection is not
# timed as a whole step: where torch's kernel is not vectorized for the CPU (measured 2.6x to 5x
# slower per row on an AVX2-only EPYC) a step, and its prefill, would cost seconds at start-up.
PROBE_LIMIT = 1.5


def probe(linear: nn.Linear, layer: QuantLinear, repeats: int = 20) -> float:
    """Seconds of `layer` over those of `linear` on one row (best of `repeats` each, alternating)."""
    row = torch.randn(1, linear.in_features, dtype=linear.weight.dtype)
    best = {"float": float("inf"), "quant": float("inf")}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, module in (("float", linear), ("quant", layer)):
                started = time.perf_counter()
                module(row)
                best[name] = min(best[name], time.perf_counter() - started)
    return best["quant"] / best["float"]


def weights_mode(model: nn.Module) -> str:
    """How the loaded model's linears compute, read from the modules themselves (so a test that
    swaps layers is described as truly as a start-up choice): e.g. "BlockQuantLinear:q4_1" and
    "BlockQuantLinear:q8_0" joined by "+"; "Linear" alone for the float model."""
    kinds = set()
    for module in model.modules():
        if not hasattr(module, "in_features") or next(module.children(), None) is not None:
            continue
        kind = type(module).__name__
        detail = getattr(module, "kind", None)
        if detail:
            kind += f":{detail}"
        if getattr(module, "int8_activations", False):
            kind += ":int8-activations"
        kinds.add(kind)
    return "+".join(sorted(kinds))


def choose(
    model: nn.Module,
    mode: str,
    time_steps: Callable[[], float],
    *,
    gguf_path: str | Path | None = None,
    progress: Callable[[str], None] = log.info,
    remembered: StartChoices | None = None,
    machine: dict[str, Any] | None = None,
) -> str:
    """Quantize the model's linears per `mode`; returns a line for the start-up log.

    "gguf", "int8", "int4" apply that mode. "auto" tries the modes the quality figures allow
    (AUTO_CANDIDATES, in order of preference): for torch's kernels a one-row probe of the largest
    projection first; then `time_steps` (the seconds of representative decode steps) against the
    model as loaded, keeping the first that beats the float model by MARGIN. "none" leaves the
    model alone.

    `remembered`: where auto's decisive choices are kept, keyed by `machine` (the CPU, torch,
    threads, weights) and the candidates, so a later start on the same key skips the timing.
    """
    if mode not in MODES:
        raise ValueError(f"CHAT_MODEL_QUANT={mode!r}: use one of {', '.join(MODES)}")
    if mode == "none":
        return "weights not quantized (CHAT_MODEL_QUANT=none)"
    if model.device.type != "cpu":
        if mode == "auto":
            return f"weights not quantized: no weight-only kernel for {model.device.type} here"
        raise ValueError(f"CHAT_MODEL_QUANT={mode}: there is no such kernel for {model.device}")
    if mode != "auto":
        unavailable = _unavailable(mode, progress)
        if unavailable:
            raise ValueError(f"CHAT_MODEL_QUANT={mode}: {unavailable}")
        _, from_gguf = _apply(model, mode, gguf_path)
        return f"weights {mode} (CHAT_MODEL_QUANT={mode}){_source(mode, from_gguf)}"
    if not AUTO_CANDIDATES:
        return (
            "weights not quantized (auto): no mode has yet matched fp32's quality "
            "(CHAT_MODEL_QUANT=gguf, int4 or int8 forces one)"
        )
    key = {**(machine or {}), "candidates": list(AUTO_CANDIDATES), "margin": MARGIN}
    key["kernels"] = hashlib.sha256(blockquant.SOURCE.read_bytes()).hexdigest()[:16]
    if remembered is not None:
        line = _remembered_choice(model, remembered.get("quant", key), gguf_path, progress)
        if line is not None:
            return line
    best, line, timings = _measured_choice(model, time_steps, gguf_path, progress)
    if remembered is not None and decisive(timings):
        remembered.put("quant", key, {"mode": best, "timings": timings})
    return line


def _remembered_choice(
    model: nn.Module,
    choice: dict[str, Any] | None,
    gguf_path: str | Path | None,
    progress: Callable[[str], None],
) -> str | None:
    """Apply a remembered auto choice; None when there is none usable (then auto measures)."""
    if choice is None:
        return None
    best, timings = choice.get("mode"), choice.get("timings")
    if best not in ("none", *AUTO_CANDIDATES) or not isinstance(timings, dict):
        return None
    if best != "none":
        if _unavailable(best, progress):
            return None
        _, from_gguf = _apply(model, best, gguf_path)
    figures = ", ".join(
        f"{name} {float(seconds) * 1000:.0f} ms" for name, seconds in timings.items()
    )
    return (
        f"weights {'not quantized' if best == 'none' else best} (auto, as measured before on this "
        f"machine: decode steps {figures})" + (_source(best, from_gguf) if best != "none" else "")
    )


def _measured_choice(
    model: nn.Module,
    time_steps: Callable[[], float],
    gguf_path: str | Path | None,
    progress: Callable[[str], None],
) -> tuple[str, str, dict[str, float]]:
    """Time the candidates against the model as loaded and keep the best: (mode, log line,
    timings)."""
    timings: dict[str, float] = {}
    notes: list[str] = []
    applied: tuple[str, list[tuple[nn.Module, str, nn.Module]], int] | None = (
        None  # the candidate left in place after its timing
    )
    gate = _largest_projection(model)[1]  # probed while the float layers are in place
    for candidate in AUTO_CANDIDATES:
        unavailable = _unavailable(candidate, progress)
        if unavailable:
            notes.append(f"{candidate}: {unavailable}")
            continue
        if not candidate.startswith("gguf"):
            ratio = probe(gate, getattr(QuantLinear, candidate)(gate.weight))
            if ratio > PROBE_LIMIT:
                notes.append(f"{candidate} kernel {ratio:.1f}x float on one row, not tried")
                continue
        if applied is not None:
            restore(applied[1])
        elif not timings:
            timings["none"] = time_steps()
        undo, from_gguf = _apply(model, candidate, gguf_path)
        applied = (candidate, undo, from_gguf)
        timings[candidate] = time_steps()
    best = min(timings, key=timings.__getitem__) if timings else "none"
    if best != "none" and timings[best] >= timings["none"] * MARGIN:
        best = "none"
    if applied is not None and applied[0] != best:
        restore(applied[1])
        applied = None
    if best != "none" and applied is None:
        applied = (best, *_apply(model, best, gguf_path))
    line = _auto_line(best, timings, notes) + (_source(best, applied[2]) if applied else "")
    return best, line, timings


def _unavailable(mode: str, progress: Callable[[str], None]) -> str | None:
    """Why `mode` cannot run here, or None."""
    if mode in ("gguf", "gguf-q8"):
        if blockquant.kernels(progress) is None:
            return blockquant.failure()
        return None
    if not kernels_available():
        return "torch has no such CPU kernel in this build"
    return None


def _apply(
    model: nn.Module, mode: str, gguf_path: str | Path | None
) -> tuple[list[tuple[nn.Module, str, nn.Module]], int]:
    if mode in ("gguf", "gguf-q8"):
        return quantize_blocks(model, gguf_path=gguf_path, int8_activations=mode == "gguf-q8")
    blocks = gguf_int4_layers(gguf_path, model) if mode == "int4" and gguf_path else {}
    return quantize(model, mode, gguf_blocks=blocks)


def _auto_line(best: str, timings: dict[str, float], notes: list[str]) -> str:
    figures = ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in timings.items())
    return (
        f"weights {'not quantized' if best == 'none' else best} (auto)"
        + (f": decode steps {figures}" if timings else "")
        + "".join(f"; {note}" for note in notes)
    )


def _largest_projection(model: nn.Module) -> tuple[str, nn.Linear]:
    """(name, layer) of the largest projection other than the LM head: what the probe times."""
    output = _output_linear(model)
    name, linear = max(
        ((q, lin) for _, _, _, lin, q in _projections(model) if lin is not output),
        key=lambda item: item[1].weight.numel(),
    )
    return name, linear


def _output_linear(model: nn.Module) -> nn.Module | None:
    """The LM head's nn.Linear, looking through a weight-major wrapper."""
    output = model.get_output_embeddings()
    return output.linear if isinstance(output, WeightMajorLinear) else output


def _source(mode: str, from_gguf: int) -> str:
    if mode == "int4":
        return f", {from_gguf} layers from the GGUF's Q4_1 blocks"
    if mode in ("gguf", "gguf-q8"):
        return f", {from_gguf} layers read from the GGUF file's own blocks"
    return ""


# The modes `auto` may pick, in order of preference: those whose quality figures matched fp32's
# (docs/benchmarks.md). "gguf" computes the bundled file's own blocks in fp32 (the weights
# llama.cpp reads, without the bf16 rounding of the converted copy): perplexity -0.04 %, 19 of
# the 20 dtypecheck answers on eos as fp32. int8 (17/20), int4 (18/20) and gguf-q8 (18/20, its
# int8 activations) ended fewer, so they stay opt-in.
AUTO_CANDIDATES: tuple[str, ...] = ("gguf",)
