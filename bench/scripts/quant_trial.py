"""Weight quantization candidates side by side: decode-step speed at 1 and 8 rows, logits vs fp32.

    PYTHONPATH=. .venv/bin/python bench/scripts/quant_trial.py [--rounds 5] [--steps 8]

Candidates, all on the same loaded model (layers swapped in place, alternating per round so a
busy neighbour on the CPU hurts them alike):
  fp32          today's nn.Linear (weight-major off), and fp32-wm with weight-major matmuls
  int8[/bf16]   aten._weight_int8pack_mm, int8 per row, activations fp32 (or bf16)
  int4[/bf16]   aten._weight_int4pack_mm_for_cpu from the GGUF file's own Q4_1 blocks, LM head int8
  int4-requant  the same kernel, re-quantized from the loaded (dequantized) weights
  gguf          the GGUF file's own Q4_1/Q8_0 blocks through chat/engine/kernels, fp32 activations
  gguf-q8       the same blocks with int8 activations (llama.cpp's arithmetic)
  dyn8          torch.ao quantize_dynamic (FBGEMM: int8 weights and per-step int8 activations)

Speed: per round, one step's best of --steps at each batch size; the median over rounds is
printed, with tok/s and the ratio to fp32. Agreement: one forward over a prompt and fp32's greedy
answer to it; top-1 agreement with fp32 on the answer's positions, max |logit - fp32| and mean KL.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings_bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rows", default="1,8")
    parser.add_argument(
        "--only", default="", help="comma-separated candidate names (default: all of them)"
    )
    args = parser.parse_args()
    import django

    django.setup()
    from dataclasses import replace

    import torch
    from torch import nn

    from chat.engine.local.loader import load_backend
    from chat.engine.weights import blockquant, gguf_blocks, quantized, weight_major
    from chat.engine.weights.loading import bundled_gguf_path
    from chat.infra.runtime import runtime

    config = replace(runtime.engine_config(), weight_major="off", dtype="float32", quant="none")
    backend = load_backend(config, progress=lambda line: None)
    model = backend.model
    originals = {q: lin for _, _, _, lin, q in quantized.projections(model)}
    parents = {q: (p, n) for p, n, _, _, q in quantized.projections(model)}

    def layers_of(mode, dtype=torch.float32, blocks=None):
        undo, _ = quantized.quantize(model, mode, gguf_blocks=blocks, compute_dtype=dtype)
        built = {q: getattr(parents[q][0], parents[q][1]) for q in originals}
        quantized.restore(undo)
        return built

    gguf = bundled_gguf_path()
    blocks32 = gguf_blocks.gguf_int4_layers(gguf, model, torch.float32)
    blocks16 = gguf_blocks.gguf_int4_layers(gguf, model, torch.bfloat16)
    print(f"GGUF Q4_1 layers matched: {len(blocks32)}")
    dynamic = torch.ao.quantization.quantize_dynamic(
        copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8
    )
    dyn_modules = dict(dynamic.named_modules())
    candidates = {
        "fp32": dict(originals),
        "fp32-wm": {q: weight_major.WeightMajorLinear(lin) for q, lin in originals.items()},
        "int8": layers_of("int8"),
        "int8/bf16": layers_of("int8", torch.bfloat16),
        "int4": layers_of("int4", torch.float32, blocks32),
        "int4/bf16": layers_of("int4", torch.bfloat16, blocks16),
        "int4-requant": layers_of("int4"),
        "dyn8": {q: dyn_modules[q] for q in originals},
    }
    if blockquant.kernels() is not None:
        candidates["gguf"] = gguf_blocks.gguf_block_layers(gguf, model)
        candidates["gguf-q8"] = candidates["gguf"]
    del dynamic
    if args.only:
        keep = {"fp32", *args.only.split(",")}
        candidates = {k: v for k, v in candidates.items() if k in keep}

    def use(name):
        for layer in candidates.get("gguf", {}).values():
            layer.int8_activations = name == "gguf-q8"
        for q, layer in candidates[name].items():
            setattr(parents[q][0], parents[q][1], layer)

    # Agreement with fp32 on a prompt and fp32's own greedy answer.
    use("fp32")
    request = backend.request(
        [{"role": "user", "content": "Explain how a rainbow forms, step by step."}],
        max_new_tokens=96,
    )
    answer = backend.generate(request)
    ids = request.input_ids + backend.tokenizer.encode(answer.text)
    start = len(request.input_ids) - 1
    tokens = torch.tensor([ids])

    def logits():
        with torch.inference_mode():
            return model(input_ids=tokens).logits[0, start:-1].float()

    reference = logits()
    print(f"agreement on {len(ids) - 1 - start} answer tokens of fp32's greedy answer:")
    print(f"  {'candidate':<13} {'top-1':>7} {'max|dlogit|':>12} {'mean KL':>9}")
    for name in candidates:
        use(name)
        got = logits()
        top1 = (got.argmax(-1) == reference.argmax(-1)).float().mean().item()
        kl = torch.nn.functional.kl_div(
            got.log_softmax(-1), reference.log_softmax(-1), log_target=True, reduction="batchmean"
        ).item()
        diff = (got - reference).abs().max().item()
        print(f"  {name:<13} {top1:>7.1%} {diff:>12.3f} {kl:>9.5f}")

    rows = [int(r) for r in args.rows.split(",")]
    times: dict[tuple[str, int], list[float]] = {(name, r): [] for name in candidates for r in rows}
    for round_ in range(args.rounds):
        order = list(candidates) if round_ % 2 == 0 else list(reversed(candidates))
        for name in order:
            use(name)
            for r in rows:
                times[name, r].append(backend.time_decode_step(r, args.steps))
    use("fp32")
    print(
        f"\ndecode step, median over {args.rounds} rounds of best-of-{args.steps}; "
        f"{torch.get_num_threads()} threads, 1-min load {os.getloadavg()[0]:.1f}"
    )
    header = "".join(f" {f'{r} row(s)':>24}" for r in rows)
    print(f"  {'candidate':<13}{header}")
    base = {r: statistics.median(times["fp32", r]) for r in rows}
    for name in candidates:
        cells = ""
        for r in rows:
            t = statistics.median(times[name, r])
            cells += f" {t * 1000:>6.1f} ms {r / t:>6.1f} t/s {base[r] / t:>4.2f}x"
        print(f"  {name:<13}{cells}")


if __name__ == "__main__":
    main()
