"""The local transformers model: render the chat template, generate, stream, stop."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..text.eos import token_id
from ..text.template import encode_pieces, encode_text, render_pieces, tokenizer_digest
from ..types import (
    EngineConfig,
    GenerationRequest,
    GenerationResult,
    OnText,
    Progress,
    PromptTooLong,
    SteppedBackend,
)
from ..weights import blockquant, quant_choice, quantized, weight_major
from ..weights.around_blocks import load_around_blocks
from ..weights.start_choices import START_CHOICES_FILE, StartChoices, machine_identity
from . import attention
from .batching import Row
from .decoding import RunningBatch
from .device import pick_device, pick_dtype
from .heap import HeapTrimmer
from .llama_step import describe as describe_fused_step
from .llama_step import unsupported as fused_step_unsupported
from .prefix_store import PrefixStore
from .row_processors import sampling_processors
from .stopping import StopStrings
from .threads import ThreadPlan

log = logging.getLogger(__name__)

STOP_CRITERIA_KEPT = 64


class LocalBackend(SteppedBackend[Row]):
    """A Hugging Face causal LM held in this process.

    Args:
        model: the loaded model, in eval mode on its device.
        tokenizer: its tokenizer, with a chat template.
        config: the engine settings it was loaded with.
        model_id: a readable name (folder name).
        fingerprint: sha256 of the weight files; part of every cache key.
    """

    config: EngineConfig

    def __init__(
        self, model: Any, tokenizer: Any, config: EngineConfig, *, model_id: str, fingerprint: str
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.model_id = model_id
        self.fingerprint = fingerprint
        self.device = model.device
        self.context_length = int(getattr(model.config, "max_position_embeddings", 2048))
        self.eos_token_ids = self._model_eos_ids()
        self._stop_criteria: OrderedDict[tuple[str, ...], StopStrings] = OrderedDict()
        self._stop_lock = threading.Lock()
        self.prefix_store = PrefixStore(config.prefix_cache_mb * 1024 * 1024)
        self.threads = ThreadPlan.configured(config.threads, config.decode_threads)
        self.heap = HeapTrimmer()
        self._tokenizer_digest = tokenizer_digest(tokenizer)
        self._identity: dict[str, str] | None = None

    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        config: EngineConfig,
        *,
        fingerprint: str,
        progress: Progress = log.info,
        gguf: str | Path | None = None,
    ) -> LocalBackend:
        """Load the model and tokenizer in `folder`; `fingerprint` identifies its weights.

        `gguf`: the GGUF file the folder was converted from, whose 4-bit blocks int4 mode reads.
        """
        folder = Path(folder)
        threads = ThreadPlan.configured(config.threads, config.decode_threads)
        torch.set_num_threads(threads.prefill)  # loading is all large operators
        device = pick_device(config.device)
        dtype = pick_dtype(config.dtype, device)
        started = time.perf_counter()
        progress(f"Loading {folder.name} ({dtype}, {device}, {threads.describe()})...")
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        # On a CPU, decode steps' attention as plain matmuls (attention.py): torch's flash
        # kernel costs several times more for one query token.
        attn = attention.register() if device == "cpu" else None
        remembered = StartChoices(Path(config.data_dir) / START_CHOICES_FILE)
        machine = {
            "cpu": machine_identity(),
            "torch": torch.__version__,
            "threads": threads.describe(),
            "dtype": str(dtype),
            "weights": fingerprint,
            "gguf": str(gguf),
        }
        # Where the weights will be the GGUF file's blocks anyway, the model is built around the
        # blocks kept by an earlier start, without loading the float linears (around_blocks.py).
        around = (
            _around_kept_blocks(
                folder,
                config.quant,
                gguf,
                dtype=dtype,
                attn=attn,
                remembered=remembered,
                machine=machine,
                progress=progress,
            )
            if device == "cpu" and gguf is not None
            else None
        )
        if around is not None:
            model, quant_line = around
            backend = cls(model, tokenizer, config, model_id=folder.name, fingerprint=fingerprint)
        else:
            model = (
                AutoModelForCausalLM.from_pretrained(
                    str(folder), dtype=dtype, attn_implementation=attn
                )
                .to(device)
                .eval()
            )
            backend = cls(model, tokenizer, config, model_id=folder.name, fingerprint=fingerprint)
            # Weights first: a block mode leaves no float linear for weight-major to time, which
            # saves seconds of start-up; the float model keeps weight-major's choice as before.
            quant_line = quant_choice.choose(
                model,
                config.quant,
                backend.time_quant_steps,
                gguf_path=gguf,
                progress=progress,
                remembered=remembered,
                machine=machine,
            )
        return backend.ready(quant_line, device, progress, started)

    def ready(
        self, quant_line: str, device: str, progress: Progress, started: float
    ) -> LocalBackend:
        """The last of loading, whatever the weights came from: weight-major's choice for float
        linears, the progress lines, and nothing kept from the timing runs."""
        float_linears = any(type(module) is nn.Linear for module in self.model.modules())
        if device == "cpu" and self.config.weight_major != "off" and float_linears:
            progress(
                "  "
                + weight_major.choose(self.model, self.time_decode_step, self.config.weight_major)
            )
        progress("  " + quant_line)
        progress("  decode step: " + self.describe_step())
        # The timing runs above stored KV of weights that may since have been replaced.
        self.prefix_store.clear()
        self.forget_identity()
        # Float weights that a quant timing loaded and dropped stay in the heap otherwise.
        self.heap.trim()
        progress(f"  model ready in {time.perf_counter() - started:.1f} s")
        return self

    def describe_step(self) -> str:
        """How a decode step runs on this model: fused and on how many threads, or eager and why."""
        if self.config.step != "fused":
            return "transformers' forward (CHAT_ENGINE step=eager)"
        why = fused_step_unsupported(self.model)
        return (
            f"transformers' forward ({why})"
            if why
            else describe_fused_step(self.threads.step_helpers)
        )

    def time_decode_step(self, rows: int = 4, steps: int = 3) -> float:
        """Seconds of one decode step of `rows` short answers (best of `steps`), for tuning."""
        batch = self.new_batch()
        requests = [
            self.request(
                [{"role": "user", "content": f"Tell me a story, number {i}."}],
                max_new_tokens=steps + 2,
                min_new_tokens=steps + 2,
            )
            for i in range(rows)
        ]
        batch.add([self.row(request, lambda text: None) for request in requests])
        batch.step()  # the first step after a prefill pays one-off allocations
        best = float("inf")
        for _ in range(steps):
            started = time.perf_counter()
            batch.step()
            best = min(best, time.perf_counter() - started)
        return best

    def time_quant_steps(self) -> float:
        """Seconds of a 1-row and a 4-row decode step together: what CHAT_ENGINE quant=auto
        compares (one stream and a small batch weigh alike)."""
        return self.time_decode_step(1, 3) + self.time_decode_step(4, 3)

    def model_identity(self) -> dict[str, str]:
        """The weight files, how the linears compute them (quantization mode and kernels), the
        dtype and device, and the tokenizer: processes that differ in any would answer differently.
        Read once (walking the modules costs about a millisecond, on every turn's cache key);
        whatever swaps layers after that calls `forget_identity`."""
        if self._identity is None:
            self._identity = self._read_identity()
        return self._identity

    def forget_identity(self) -> None:
        self._identity = None

    def _read_identity(self) -> dict[str, str]:
        mode = quantized.weights_mode(self.model)
        return {
            "weights": self.fingerprint,
            "mode": mode,
            "dtype": str(self.model.dtype),
            "device": str(self.device),
            "kernels": blockquant.kernels().isa() if "BlockQuantLinear" in mode else "",
            # The fused step sums in another order than transformers' forward: a near tie may
            # pick another token, so the two never share answers.
            "step": "fused"
            if self.config.step == "fused" and not fused_step_unsupported(self.model)
            else "eager",
            "tokenizer": self._tokenizer_digest,
        }

    # -- prompts --------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The exact model input for a conversation, via the tokenizer's chat template."""
        return "".join(text for text, _ in render_pieces(self.tokenizer, messages))

    def encode(self, messages: list[dict[str, Any]]) -> list[int]:
        """The ids fed to the model for `messages`; their contents never become control tokens."""
        if isinstance(messages, str):
            raise TypeError("encode() takes the messages: a rendered string hides typed markers")
        return encode_pieces(self.tokenizer, render_pieces(self.tokenizer, messages))

    def token_count(self, text: str) -> int:
        return len(encode_text(self.tokenizer, text))

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Refuse, rather than truncate, a prompt that leaves no room for the answer."""
        PromptTooLong.check(prompt_tokens, max_new_tokens, self.context_length)

    def request(self, messages: list[dict[str, Any]], **options: Any) -> GenerationRequest:
        """Render and tokenize `messages` into a request (convenience for plain Python)."""
        options.setdefault("max_new_tokens", min(256, self.config.max_new_tokens_cap))
        return GenerationRequest.of(self.encode(messages), **options)

    # -- eos ------------------------------------------------------------------

    def _model_eos_ids(self) -> list[int]:
        configured = self.model.generation_config.eos_token_id
        ids = configured if isinstance(configured, list) else [configured]
        ids = [i for i in ids if i is not None]
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    def token_id(self, token: str) -> int | None:
        """Id of a single token (e.g. "<|im_end|>"), or None if the vocabulary lacks it."""
        return token_id(self.tokenizer, token)

    # -- generation -----------------------------------------------------------

    def generate(
        self, request: GenerationRequest, on_text: OnText = lambda _text: None
    ) -> GenerationResult:
        """Generate one answer in the calling thread, handing visible text to `on_text`.

        The text handed out, concatenated, is exactly `result.text`.
        """
        return self.generate_batch([request], [on_text])[0]

    def generate_batch(
        self, requests: list[GenerationRequest], on_texts: list[OnText]
    ) -> list[GenerationResult]:
        """Generate several answers together in a running batch, each streamed and stopped on its own.

        Any mix of sampling settings and constrained requests may share it; a row
        that ends leaves the batch at once.
        """
        rows = [self.row(r, t) for r, t in zip(requests, on_texts, strict=True)]
        batch = self.new_batch()
        started = time.perf_counter()
        finished_at = {}
        for row in batch.add(rows):
            finished_at[id(row)] = time.perf_counter()
        while len(batch):
            for row in [*batch.drop_cancelled(), *batch.step()]:
                finished_at[id(row)] = time.perf_counter()
        return [self.result(row, started, finished_at[id(row)]) for row in rows]

    def new_batch(self) -> RunningBatch:
        """An empty running batch on this model (the scheduler keeps one for its lifetime)."""
        return RunningBatch(
            self.model,
            self.pad_id,
            self.stop_string_criteria,
            prefill_chunk=self.config.prefill_chunk,
            prefix_store=self.prefix_store,
            threads=self.threads,
            fused_step=self.config.step == "fused",
            heap=self.heap,
        )

    def row(self, request: GenerationRequest, on_text: OnText) -> Row:
        """A request made ready to join a batch; raises PromptTooLong if it cannot fit."""
        max_new = max(1, min(request.params.max_new_tokens, self.config.max_new_tokens_cap))
        self.check_fits(len(request.input_ids), max_new)
        row = Row(
            request,
            on_text,
            max_new,
            frozenset([*self.eos_token_ids, *request.params.eos_token_ids]),
            tokenizer=self.tokenizer,
        )
        constrained = None
        if request.params.json_schema is not None:
            from .constrained import logits_processor

            constrained = logits_processor(
                self.tokenizer, self.model.config.vocab_size, request.params.json_schema
            )
        elif request.params.tool_grammar is not None:
            from .constrained import tool_call_processor

            constrained = tool_call_processor(
                self.tokenizer, self.model.config.vocab_size, request.params.tool_grammar
            )
        row.processors = sampling_processors(row, constrained)
        return row

    @staticmethod
    def result(row: Row, started: float, finished: float) -> GenerationResult:
        return GenerationResult(
            text=row.text,
            finish_reason=row.reason or "cancelled",
            new_tokens=len(row.new_ids),
            prompt_tokens=len(row.request.input_ids),
            started_at=started,
            first_token_at=row.first_token_at,
            finished_at=finished,
        )

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.eos_token_ids[0]

    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token takes in every layer (keys and values)."""
        config = self.model.config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        size: int = torch.empty((), dtype=self.model.dtype).element_size()
        per_token: int = 2 * config.num_hidden_layers * heads * head_dim * size
        return per_token

    def stop_string_criteria(self, stop_strings: tuple[str, ...]) -> StopStrings:
        """The check for a set of stop strings, built once per set (it is stateless).

        Building one scans the vocabulary, 0.8 s on this model: per request, that was
        most of the time to first token.
        """
        with self._stop_lock:
            criteria = self._stop_criteria.get(stop_strings)
            if criteria is None:
                criteria = self._stop_criteria[stop_strings] = StopStrings(
                    self.tokenizer, stop_strings
                )
                # API clients choose their own stop strings: keep the recent sets, not every one.
                while len(self._stop_criteria) > STOP_CRITERIA_KEPT:
                    self._stop_criteria.popitem(last=False)
            self._stop_criteria.move_to_end(stop_strings)
            return criteria


def _around_kept_blocks(
    folder: Path,
    quant: str,
    gguf: str | Path,
    *,
    dtype: torch.dtype,
    attn: str | None,
    remembered: StartChoices,
    machine: dict[str, str],
    progress: Progress,
) -> tuple[nn.Module, str] | None:
    """The model built around the GGUF blocks an earlier start kept, and its start-up line, where
    the weight mode is a block mode before anything is timed; None otherwise (the caller loads
    the float model and lets quant_choice decide)."""
    decided = quant_choice.decided_block_mode(
        quant, remembered=remembered, machine=machine, progress=progress
    )
    if decided is None:
        return None
    mode, why = decided
    built = load_around_blocks(
        folder,
        gguf_path=gguf,
        dtype=dtype,
        attn_implementation=attn,
        int8_activations=mode == "gguf-q8",
    )
    if built is None:
        return None
    model, from_gguf = built
    return model, (
        f"weights {mode} ({why}), {from_gguf} layers from the GGUF file's own blocks, kept "
        "beside the model (the float linears were not loaded)"
    )
