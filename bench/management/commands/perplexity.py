"""`manage.py perplexity`: the perplexity of a fixed public-domain text, per weight mode.

    .venv/bin/python manage.py perplexity --settings project.settings_bench \
        [--modes none,int8,int4] [--simulate] [--chunk 512]

The text is bench/data/public_domain.txt (2,860 tokens with SmolLM2's tokenizer): the United
States Declaration of Independence (1776), Lincoln's Gettysburg Address (1863) and his Second
Inaugural Address (1865), transcribed; all three are in the public domain. It is fed in chunks
of --chunk tokens on one KV cache, so every token but the first is predicted from all before it.
A mode whose perplexity is more than 5% above float's is not a candidate for CHAT_ENGINE quant=auto
(chat/engine/weights/quant_choice.py AUTO_CANDIDATES). --simulate computes int8/int4 with the same weights in
float matmuls (bench/quant_modes.py), for a CPU whose kernels for them are slow.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from django.core.management.base import BaseCommand

import chat.engine  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads, as the server does)
from bench.quant_modes import load_mode

TEXT = Path(__file__).resolve().parents[2] / "data" / "public_domain.txt"


def perplexity(backend, text: str, chunk: int = 512) -> tuple[float, int]:
    """(perplexity, tokens predicted) of `text` under the backend's model."""
    import torch
    from transformers import DynamicCache

    ids = backend.tokenizer(text, return_tensors="pt").input_ids.to(backend.model.device)
    cache = DynamicCache()
    nll, counted = 0.0, 0
    with torch.inference_mode():
        for start in range(0, ids.shape[1], chunk):
            piece = ids[:, start : start + chunk + 1]  # one more: the last token's target
            inputs = piece[:, :-1] if piece.shape[1] > 1 else piece
            out = backend.model(input_ids=inputs, past_key_values=cache, use_cache=True)
            targets = piece[:, 1:]
            if targets.shape[1] == 0:
                break
            logprobs = out.logits[0, : targets.shape[1]].float().log_softmax(-1)
            nll -= logprobs.gather(-1, targets[0, :, None]).sum().item()
            counted += targets.shape[1]
    return math.exp(nll / counted), counted


class Command(BaseCommand):
    help = "Perplexity of the shipped public-domain text under each weight mode."

    def add_arguments(self, parser):
        parser.add_argument("--modes", default="none,int8,int4")
        parser.add_argument("--simulate", action="store_true")
        parser.add_argument("--chunk", type=int, default=512)

    def handle(self, *args, modes, simulate, chunk, **options):
        text = TEXT.read_text()
        base = None
        for mode in modes.split(","):
            backend, label = load_mode(
                mode, simulate=simulate, progress=lambda line: self.stderr.write(line)
            )
            started = time.perf_counter()
            value, tokens = perplexity(backend, text, chunk)
            base = base or value
            self.stdout.write(
                f"{label:18} perplexity {value:7.3f} ({value / base - 1:+.1%} vs the first) "
                f"over {tokens} tokens in {time.perf_counter() - started:.1f} s"
            )
