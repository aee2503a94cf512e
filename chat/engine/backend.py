"""The local transformers model: render the chat template, generate, stream, stop."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    StoppingCriteriaList,
    StopStringCriteria,
)

from .batching import BatchStoppingCriteria, BatchStreamer, Row, finish_reason, left_pad
from .eos import token_id
from .stopping import StopStringHoldback
from .template import encode_pieces, encode_text, render_pieces
from .types import (
    EngineConfig,
    GenerationRequest,
    GenerationResult,
    OnText,
    Progress,
    PromptTooLong,
)

log = logging.getLogger(__name__)

STOP_CRITERIA_KEPT = 64


def pick_device(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def pick_dtype(requested: str, device: str) -> torch.dtype:
    if requested != "auto":
        return getattr(torch, requested)
    # On the CPU, bf16 made SmolLM2 miss its end-of-turn token: 2 of 6 short greedy answers ran on
    # to max_new_tokens, none in fp32. On a 2-core AMX Xeon fp32 decoded as fast (16.1 vs 15.4
    # tok/s), so the answer ending where it should is worth the extra 0.3 GB. GPUs keep bf16.
    return torch.bfloat16 if device == "cuda" else torch.float32


class LocalBackend:
    """A Hugging Face causal LM held in this process.

    Args:
        model: the loaded model, in eval mode on its device.
        tokenizer: its tokenizer, with a chat template.
        config: the engine settings it was loaded with.
        model_id: a readable name (folder name).
        fingerprint: sha256 of the weight files; part of every cache key.
    """

    def __init__(self, model, tokenizer, config: EngineConfig, *, model_id: str, fingerprint: str):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.model_id = model_id
        self.fingerprint = fingerprint
        self.device = model.device
        self.context_length = int(getattr(model.config, "max_position_embeddings", 2048))
        self.eos_token_ids = self._model_eos_ids()
        self._stop_criteria: OrderedDict[tuple[str, ...], StopStringCriteria] = OrderedDict()
        self._stop_lock = threading.Lock()

    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        config: EngineConfig,
        *,
        fingerprint: str,
        progress: Progress = log.info,
    ) -> LocalBackend:
        """Load the model and tokenizer in `folder`; `fingerprint` identifies its weights."""
        folder = Path(folder)
        if config.threads:
            torch.set_num_threads(config.threads)
        device = pick_device(config.device)
        dtype = pick_dtype(config.dtype, device)
        started = time.perf_counter()
        progress(f"Loading {folder.name} ({dtype}, {device}, {torch.get_num_threads()} threads)...")
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device).eval()
        progress(f"  model ready in {time.perf_counter() - started:.1f} s")
        return cls(model, tokenizer, config, model_id=folder.name, fingerprint=fingerprint)

    # -- prompts --------------------------------------------------------------

    def render(self, messages: list[dict]) -> str:
        """The exact model input for a conversation, via the tokenizer's chat template."""
        return "".join(text for text, _ in render_pieces(self.tokenizer, messages))

    def encode(self, messages: list[dict]) -> list[int]:
        """The ids fed to the model for `messages`; their contents never become control tokens."""
        if isinstance(messages, str):
            raise TypeError("encode() takes the messages: a rendered string hides typed markers")
        return encode_pieces(self.tokenizer, render_pieces(self.tokenizer, messages))

    def token_count(self, text: str) -> int:
        return len(encode_text(self.tokenizer, text))

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Refuse, rather than truncate, a prompt that leaves no room for the answer."""
        PromptTooLong.check(prompt_tokens, max_new_tokens, self.context_length)

    def request(self, messages: list[dict], **options) -> GenerationRequest:
        """Render and tokenize `messages` into a request (convenience for plain Python)."""
        options.setdefault("max_new_tokens", min(256, self.config.max_new_tokens_cap))
        return GenerationRequest(input_ids=self.encode(messages), **options)

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
        """Generate several answers in one left-padded `generate` call, each streamed and stopped on its own.

        All requests must share their sampling settings (see `batch_signature`); a
        constrained (json_schema) request must be alone.
        """
        rows = []
        for request, on_text in zip(requests, on_texts, strict=True):
            max_new = max(1, min(request.max_new_tokens, self.config.max_new_tokens_cap))
            self.check_fits(len(request.input_ids), max_new)
            rows.append(
                Row(
                    request,
                    on_text,
                    max_new,
                    frozenset([*self.eos_token_ids, *request.eos_token_ids]),
                    StopStringHoldback(request.stop_strings),
                )
            )
        head = requests[0]
        sampling = (
            {"do_sample": True, "temperature": head.temperature, "top_p": head.top_p}
            if head.temperature > 0
            else {"do_sample": False}
        )
        if head.json_schema is not None:
            if len(requests) > 1:
                raise ValueError("a constrained request must be generated alone")
            from .constrained import logits_processor

            sampling["logits_processor"] = [
                logits_processor(self.tokenizer, self.model.config.vocab_size, head.json_schema)
            ]
        if any(r.min_new_tokens for r in requests):
            sampling["min_new_tokens"] = max(r.min_new_tokens for r in requests)
        pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self.eos_token_ids[0]
        )
        input_ids, attention_mask = left_pad([r.input_ids for r in requests], pad_id, self.device)
        started = time.perf_counter()
        with torch.inference_mode():
            self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max(row.max_new for row in rows),
                eos_token_id=self.eos_token_ids,
                pad_token_id=pad_id,
                stopping_criteria=StoppingCriteriaList(
                    [BatchStoppingCriteria(self.stop_string_criteria, rows, input_ids.shape[1])]
                ),
                streamer=BatchStreamer(self.tokenizer, rows),
                **sampling,
            )
        finished = time.perf_counter()
        results = []
        for row in rows:
            row.flush()
            results.append(
                GenerationResult(
                    text="".join(row.shown),
                    finish_reason=finish_reason(row),
                    new_tokens=len(row.new_ids),
                    prompt_tokens=len(row.request.input_ids),
                    started_at=started,
                    first_token_at=row.first_token_at,
                    finished_at=finished,
                )
            )
        return results

    def stop_string_criteria(self, stop_strings: tuple[str, ...]) -> StopStringCriteria:
        """transformers' StopStringCriteria, built once per set of stop strings (it is stateless).

        Building one scans the vocabulary, 0.8 s on this model: per request, that was
        most of the time to first token.
        """
        with self._stop_lock:
            criteria = self._stop_criteria.get(stop_strings)
            if criteria is None:
                criteria = self._stop_criteria[stop_strings] = StopStringCriteria(
                    self.tokenizer, list(stop_strings)
                )
                # API clients choose their own stop strings: keep the recent sets, not every one.
                while len(self._stop_criteria) > STOP_CRITERIA_KEPT:
                    self._stop_criteria.popitem(last=False)
            self._stop_criteria.move_to_end(stop_strings)
            return criteria

    @staticmethod
    def batch_signature(request: GenerationRequest):
        """Requests with equal signatures may share a batch; None means "only alone"."""
        if request.json_schema is not None:
            return None
        return (request.temperature, request.top_p) if request.temperature > 0 else ("greedy",)
