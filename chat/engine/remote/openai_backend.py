"""An inference server (vLLM, text-generation-inference) behind the OpenAI-compatible streaming chat API.

`OpenAIBackend` stands in for `LocalBackend`: the rest of the app renders, counts,
caches and streams the same way, but tokens come from `POST {base_url}/chat/completions`
with `stream: true`. What has no remote meaning is decided here:

- `render(messages)` is a canonical JSON of the messages: that, not a local template,
  is what the server receives, so it is what the cache key must cover.
- Token counts (prompt-length guard, history trimming, policy checks) use a local
  tokenizer when one is configured (the served model's tokenizer folder, read by
  file_tokenizer.py: no transformers, no torch); without one the prompt is not counted
  here and the server's "context length" 400 becomes PromptTooLong.
- What the server accepts is found, not assumed (capabilities.py): at start-up
  (`from_config`), and from each refusal, whose named fields are dropped and the request
  sent once more.
- Batching is the server's business: each request streams on its own (concurrent.py).

Each answer is one streamed request, whose cancel closes the upstream socket at once: that is
how vLLM and TGI learn to stop generating. `generate` reads it on the calling thread (stream.py),
`agenerate` on the running event loop (loop_stream.py); both read its events alike (sse.py).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from ..text.template import (
    continues_answer,
    defuse_markers,
    encode_pieces,
    encode_text,
    render_pieces,
    special_token_pattern,
    tokenizer_digest,
)
from ..types import (
    Backend,
    EngineError,
    GenerationRequest,
    GenerationResult,
    OnText,
    Progress,
    PromptTooLong,
)
from .capabilities import Capabilities, discover
from .loop_stream import LoopStream
from .stream import Endpoint, Stream

log = logging.getLogger(__name__)


# Seconds each start-up question to the server may take (capabilities.discover).
_DISCOVER_TIMEOUT = 10.0


@dataclass(frozen=True)
class RemoteConfig:
    """Where the inference server is and how to talk to it.

    Args:
        base_url: the API root, e.g. "http://10.0.0.5:8000/v1" (the path before /chat/completions).
        model: the served model's name, sent as `model` in every request.
        api_key: sent as `Authorization: Bearer`; empty sends none.
        timeout: seconds to connect, and the longest wait for the next streamed token.
        context_length: the served model's context in tokens; 0 means unknown (the server decides).
        tokenizer_path: a local tokenizer folder for counting tokens; None counts nothing locally.
        max_new_tokens_cap: server-side ceiling on any request's max_new_tokens (sent as max_tokens).
    """

    base_url: str
    model: str
    api_key: str = ""
    timeout: float = 60.0
    context_length: int = 0
    tokenizer_path: str | None = None
    max_new_tokens_cap: int = 1024


def canonical_messages(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class OpenAIBackend(Backend):
    """Streams answers from an OpenAI-compatible chat completions endpoint.

    Args:
        config: the server's address, model and limits.
        tokenizer: the served model's tokenizer for local counting (a FileTokenizer: no torch), or None.
        capabilities: what the server was found to accept (capabilities.py); a new, empty one by default.
    """

    def __init__(
        self, config: RemoteConfig, tokenizer: Any = None, capabilities: Capabilities | None = None
    ):
        self.config = config
        self.tokenizer = tokenizer
        self.capabilities = capabilities or Capabilities()
        self.model_id = config.model
        # The weights live on the server; its URL and model name are what identify them here.
        self.fingerprint = hashlib.sha256(
            f"{config.base_url.rstrip('/')}\n{config.model}".encode()
        ).hexdigest()
        self._tokenizer_digest = tokenizer_digest(tokenizer) if tokenizer is not None else ""
        # Unknown context: never refuse locally; the server's own check answers.
        self.context_length = config.context_length or 1 << 62
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids = [eos] if eos is not None else []
        self._markers = special_token_pattern(tokenizer) if tokenizer is not None else None
        self.endpoint = Endpoint(config.base_url, config.api_key)

    @classmethod
    def from_config(cls, config: RemoteConfig, progress: Progress = log.info) -> OpenAIBackend:
        tokenizer = None
        if config.tokenizer_path:
            from ..text.file_tokenizer import FileTokenizer

            progress(f"Reading the tokenizer in {config.tokenizer_path} for token counts...")
            tokenizer = FileTokenizer(config.tokenizer_path)
            if not config.context_length:
                config = _with_context_from(config, Path(config.tokenizer_path))
        progress(f"Remote model {config.model} at {config.base_url}")
        backend = cls(config, tokenizer)
        # Asked with a short timeout: a hung server must not hold the start-up for a minute.
        probing = cls(
            replace(config, timeout=min(config.timeout, _DISCOVER_TIMEOUT)),
            tokenizer,
            capabilities=backend.capabilities,
        )
        discover(probing, progress)
        return backend

    # -- prompts --------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The messages as the server receives them, canonical JSON (the cache key covers this)."""
        return canonical_messages(messages)

    def encode(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids of what the server receives, as the local tokenizer's template renders it; [] without one."""
        if isinstance(messages, str):
            raise TypeError("encode() takes the messages: a rendered string hides typed markers")
        if self.tokenizer is None:
            return []
        return encode_pieces(self.tokenizer, render_pieces(self.tokenizer, self.sent(messages)))

    def token_count(self, text: str) -> int:
        if self.tokenizer is None:
            return 0
        return len(encode_text(self.tokenizer, text))

    def sent(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages as sent: the local tokenizer's special tokens typed in a content defused.

        The server tokenizes the rendered chat whole, so a typed `<|im_end|>` would be the
        real one there. Without a local tokenizer nothing is known to defuse.
        """
        return defuse_markers(messages, self._markers)

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Refuse, rather than truncate, a prompt that leaves no room for the answer."""
        PromptTooLong.check(prompt_tokens, max_new_tokens, self.context_length)

    def model_identity(self) -> dict[str, str]:
        """The server's URL and model name: how its weights, dtype and kernels are set is the
        server's own, so one URL and model must mean one way of answering."""
        return {"server": self.fingerprint, "tokenizer": self._tokenizer_digest}

    def request(self, messages: list[dict[str, Any]], **options: Any) -> GenerationRequest:
        """A request for `messages` (convenience for plain Python)."""
        options.setdefault("max_new_tokens", min(256, self.config.max_new_tokens_cap))
        return GenerationRequest.of(self.encode(messages), messages=messages, **options)

    def token_id(self, token: str) -> int | None:
        """Id of a single token in the local tokenizer, or None (then it cannot be sent as a stop token)."""
        if self.tokenizer is None:
            return None
        from ..text.eos import token_id

        return token_id(self.tokenizer, token)

    # -- health ---------------------------------------------------------------

    def probe(self, timeout: float = 1.0) -> str:
        """ "ok" when the server serves our model, else what is wrong.

        `GET {base}/models` listing the model says so; a server whose model list fails
        (`transformers serve` answers it with a 500) while its last completion was
        answered is serving too.
        """
        status = self.models_status(timeout)
        caps = self.capabilities
        if status != "ok" and caps.models.startswith("HTTP") and caps.chat == "ok":
            return "ok"
        return status

    def models_status(self, timeout: float = 1.0) -> str:
        """ "ok" when `GET {base}/models` answers and lists our model, else what is wrong."""
        connection = self.endpoint.connection(timeout)
        found = "unreachable"
        try:
            connection.request(
                "GET", f"{self.endpoint.path}/models", headers=self.endpoint.headers()
            )
            response = connection.getresponse()
            body = response.read(1 << 20)
            if response.status != 200:
                found = f"HTTP {response.status}"
                return f"unavailable: HTTP {response.status} from {self.config.base_url}/models"
            served = [m.get("id") for m in json.loads(body).get("data", [])]
            if self.config.model not in served:
                found = "without our model"
                return f"unavailable: {self.config.model!r} is not served (the server has {served})"
            found = "ok"
            return "ok"
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
            return f"unavailable: {exc or type(exc).__name__}"
        finally:
            connection.close()
            self.capabilities.saw(models=found)

    # -- generation -----------------------------------------------------------

    def generate_batch(
        self, requests: list[GenerationRequest], on_texts: list[OnText]
    ) -> list[GenerationResult]:
        """Stream each request on its own connection, all at once; results in request order."""
        if len(requests) == 1:
            return [self.generate(requests[0], on_texts[0])]
        with ThreadPoolExecutor(
            max_workers=len(requests), thread_name_prefix="remote-batch"
        ) as pool:
            futures = [
                pool.submit(self.generate, r, t) for r, t in zip(requests, on_texts, strict=True)
            ]
            return [f.result() for f in futures]

    def generate(
        self, request: GenerationRequest, on_text: OnText = lambda _text: None
    ) -> GenerationResult:
        """Stream one answer in the calling thread, handing visible text to `on_text`.

        The text handed out, concatenated, is exactly `result.text`.
        """
        body = self._checked_body(request)
        return Stream(
            self.endpoint, self.capabilities, self.config.timeout, request, on_text, body
        ).run()

    async def agenerate(
        self, request: GenerationRequest, on_text: OnText = lambda _text: None
    ) -> GenerationResult:
        """`generate` on the running event loop: no thread, and `on_text` is called on the
        loop's thread (loop_stream.py). Cancelling the task closes the upstream at once."""
        body = self._checked_body(request)
        return await LoopStream(
            self.endpoint, self.capabilities, self.config.timeout, request, on_text, body
        ).run()

    def _checked_body(self, request: GenerationRequest) -> dict[str, Any]:
        if request.messages is None:
            raise EngineError(
                "a remote request needs its chat messages (GenerationRequest.messages)"
            )
        max_new = max(1, min(request.params.max_new_tokens, self.config.max_new_tokens_cap))
        if request.input_ids:
            self.check_fits(len(request.input_ids), max_new)
        return self._body(request, max_new)

    def _body(self, request: GenerationRequest, max_new: int) -> dict[str, Any]:
        params = request.params
        body = {
            "model": self.config.model,
            # request() always sets them: a remote server renders the chat itself
            "messages": self.sent(cast("list[dict[str, Any]]", request.messages)),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_new,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            body["seed"] = params.seed  # OpenAI's, vLLM's and TGI's: a reproducible sample
        if params.stop_strings:
            body["stop"] = list(params.stop_strings)
        if params.eos_token_ids:
            body["stop_token_ids"] = list(
                params.eos_token_ids
            )  # vLLM's extension; asked for only by policy
        if params.min_new_tokens:
            body["min_tokens"] = params.min_new_tokens  # vLLM's extension
        if continues_answer(request.messages or []):
            # vLLM's and SGLang's way to go on writing the last assistant message.
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        if params.frequency_penalty:
            body["frequency_penalty"] = params.frequency_penalty
        if params.presence_penalty:
            body["presence_penalty"] = params.presence_penalty
        if params.repetition_penalty != 1.0:
            # vLLM's and SGLang's extension; the n-gram ban has no OpenAI-style field.
            body["repetition_penalty"] = params.repetition_penalty
        if params.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": params.json_schema, "strict": True},
            }
        return body


def _with_context_from(config: RemoteConfig, folder: Path) -> RemoteConfig:
    """The context length from the tokenizer folder's model config, when it has one."""
    try:
        model_config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return config
    length = model_config.get("max_position_embeddings")
    return replace(config, context_length=int(length)) if length else config
