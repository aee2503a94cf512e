"""The process's one model and scheduler stack, loaded in the background so the server answers at
once.

/healthz reports 503 with the loading step until `state` is "ready".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from django.conf import settings

from ..engine.local.heap import HeapTrimmer
from ..engine.stack import SchedulerStack, StackConfig, build_stack
from ..engine.types import Backend, EngineConfig, Scheduler
from ..protocol import SERVER_RESTARTING
from .engines import EngineSlots, EngineSpec, NotServing

log = logging.getLogger(__name__)


class NotReady(RuntimeError):
    def __init__(self, message: str, code: str = "model_loading"):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Serving:
    """Which engine answers a turn: its backend and stack, its row (None: the default engine),
    and whether it stands in for the policy's own engine as its fallback. `standby` gives the
    fallback's Serving (NotReady when it cannot answer either), for a turn whose engine stops
    answering before any of its text was shown; None without a fallback."""

    backend: Backend
    stack: SchedulerStack
    engine: EngineSpec | None = None
    fallback: bool = False
    standby: Callable[[], Serving] | None = None


class Runtime:
    def __init__(self):
        self.state = "idle"  # idle -> loading -> ready | failed
        self.detail = ""
        self.backend: Backend | None = None
        self.stack: SchedulerStack | None = None
        self.load_seconds: float | None = None
        # Set once the process is stopping (SIGTERM): it takes no new prompts, /healthz says 503.
        self.draining = False
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._tokenizer = None
        # The engine rows' stacks, beside the default one (engines.py).
        self.engines = EngineSlots(
            stack_config=self.stack_config,
            engine_config=self.engine_config,
            remote_config=self.remote_config,
            share_default=self._default_for,
        )

    @property
    def scheduler(self) -> Scheduler | None:
        """The scheduler that runs requests on the backend, under the stack's sharing."""
        return self.stack.base if self.stack is not None else None

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model_path=settings.CHAT_MODEL_PATH,
            data_dir=str(settings.DATA_DIR),
            dtype=settings.CHAT_MODEL_DTYPE,
            device=settings.CHAT_MODEL_DEVICE,
            threads=settings.CHAT_TORCH_THREADS,
            decode_threads=settings.CHAT_DECODE_THREADS,
            weight_major=settings.CHAT_WEIGHT_MAJOR,
            quant=settings.CHAT_MODEL_QUANT,
            prefill_chunk=settings.CHAT_PREFILL_CHUNK,
            prefix_cache_mb=settings.CHAT_PREFIX_CACHE_MB,
            max_new_tokens_cap=settings.CHAT_MAX_NEW_TOKENS_CAP,
            step=settings.CHAT_DECODE_STEP,
        )

    def start(self) -> None:
        """Begin loading on a daemon thread; calling it again does nothing."""
        with self._lock:
            if self.state != "idle":
                return
            self.state, self.detail = "loading", "starting"
        threading.Thread(target=self._load, name="model-loader", daemon=True).start()

    def _progress(self, line: str) -> None:
        self.detail = line.strip()
        log.info("%s", line)  # the newcomer watching `make run` sees each step

    def remote_config(self):
        """The inference server's settings (CHAT_BACKEND=openai)."""
        from ..engine.remote.openai_backend import RemoteConfig

        tokenizer = settings.CHAT_REMOTE_TOKENIZER
        if tokenizer == "":
            from .checks import model_dir

            folder = (
                model_dir()
            )  # the local model's folder doubles as the tokenizer when it is there
            tokenizer = str(folder) if folder is not None else None
        elif tokenizer == "none":
            tokenizer = None
        return RemoteConfig(
            base_url=settings.CHAT_REMOTE_URL,
            model=settings.CHAT_REMOTE_MODEL,
            api_key=settings.CHAT_REMOTE_API_KEY,
            timeout=settings.CHAT_REMOTE_TIMEOUT,
            context_length=settings.CHAT_REMOTE_CONTEXT_LENGTH,
            tokenizer_path=tokenizer,
            max_new_tokens_cap=settings.CHAT_MAX_NEW_TOKENS_CAP,
        )

    def stack_config(self) -> StackConfig:
        """How the scheduler stack is built (chat/engine/stack.py), from the settings."""
        return StackConfig(
            max_waiting=settings.CHAT_MAX_QUEUE,
            max_batch=settings.CHAT_MAX_BATCH,
            kv_budget_bytes=settings.CHAT_KV_CACHE_MB * 2**20,
            max_running=settings.CHAT_REMOTE_MAX_CONCURRENCY,
            global_queue_url=settings.REDIS_URL,
            global_capacity=settings.CHAT_REMOTE_GLOBAL_CONCURRENCY,
            global_lease_seconds=settings.CHAT_REMOTE_LEASE_SECONDS,
            # Identical prompts in flight share one generation across the processes on the
            # completion cache's Redis (read at each request), unless turned off.
            share_across=(lambda: settings.CHAT_CACHE_REDIS_URL)
            if settings.CHAT_COALESCE_ACROSS_PROCESSES
            else None,
            share_lease_seconds=settings.CHAT_COALESCE_LEASE_SECONDS,
        )

    def _make_backend(self) -> Backend:
        """The backend for the configured CHAT_BACKEND: an inference server, or the local model."""
        if settings.CHAT_BACKEND == "openai":
            from ..engine.remote.openai_backend import OpenAIBackend

            return OpenAIBackend.from_config(self.remote_config(), progress=self._progress)
        from ..engine.local.loader import load_backend

        return load_backend(self.engine_config(), progress=self._progress)

    def _default_for(self, model_path: str) -> tuple[Backend, SchedulerStack] | None:
        """The default engine's backend and stack when a local row names its very weights."""
        if settings.CHAT_BACKEND != "local" or (model_path or None) != settings.CHAT_MODEL_PATH:
            return None
        if self.state != "ready":  # never a second copy, nor a request held while it loads
            raise NotServing("the default engine's model is not loaded yet", code="model_loading")
        assert self.backend is not None and self.stack is not None
        return self.backend, self.stack

    def serving(
        self,
        engine: EngineSpec | None,
        fallback: EngineSpec | None = None,
        *,
        fallback_default: bool = False,
    ) -> Serving:
        """The engine a policy's turn runs on: its own, or its fallback (`fallback`, or with
        `fallback_default` the default engine) while that is down, loading or its queue full.
        Sync: a remote engine is built on its first prompt (a network call)."""
        has_fallback = fallback is not None or (fallback_default and engine is not None)

        def standby() -> Serving:  # the fallback; None: the default engine
            return replace(self._serving(fallback), fallback=True)

        try:
            chosen = self._serving(engine)
            base = chosen.stack.base
            if not has_fallback:
                return chosen
            # Full now: the fallback takes it (without one, the queue's own refusal answers).
            if base.waiting >= getattr(base, "max_waiting", 1 << 30):
                raise NotReady(
                    f"{engine.name if engine else 'the default engine'} is full", "queue_full"
                )
            return replace(chosen, standby=standby)
        except NotReady as exc:
            if not has_fallback or exc.code == SERVER_RESTARTING:
                raise
            name = engine.name if engine is not None else "the default engine"
            instead = fallback.name if fallback is not None else "the default engine"
            log.info("%s cannot answer (%s): %s answers instead", name, exc, instead)
            return standby()

    def _serving(self, engine: EngineSpec | None) -> Serving:
        if engine is None:
            return Serving(*self.require())
        if self.draining:
            self.require()  # raises server_restarting
        try:
            backend, stack = self.engines.get(engine)
        except NotServing as exc:
            raise NotReady(str(exc), code=exc.code) from None
        return Serving(backend, stack, engine)

    def _load_engine_rows(self) -> None:
        """The enabled local engine rows, loaded at start (a database not there yet: later)."""
        try:
            from ..models import Engine

            specs = [
                EngineSpec.of(row) for row in Engine.objects.filter(kind="local", enabled=True)
            ]
        except Exception as exc:
            log.info("engine rows not read at start (%s): loaded on their first prompt", exc)
            return
        self.engines.load_at_start(specs, self._progress)

    def _load(self) -> None:
        started = time.perf_counter()
        try:
            backend = self._make_backend()
            self.stack = build_stack(backend, self.stack_config())
            from .metrics import track_prefix_store, track_stack

            track_stack(self.stack)
            track_prefix_store(backend)
            self.backend = backend
        except Exception as exc:
            log.exception("model failed to load")
            self.state, self.detail = "failed", f"{type(exc).__name__}: {exc}"
        else:
            self.load_seconds = time.perf_counter() - started
            self.state, self.detail = (
                "ready",
                f"{backend.model_id} loaded in {self.load_seconds:.1f} s",
            )
        finally:
            self._ready.set()
        if self.state == "ready":
            self._load_engine_rows()
            if settings.CHAT_BACKEND == "openai":
                # The start's transient allocations, freed, stay in glibc's heap otherwise: a
                # torch-free web tier held 142 MB after start, 126 MB with them given back. (A
                # local model's backend gives its own back once loaded.)
                HeapTrimmer().trim()

    def tokenizer(self):
        """The model's tokenizer, also before the model has loaded (staff validate policies with it)."""
        if self.backend is not None:
            return self.backend.tokenizer
        if self._tokenizer is None:
            from .checks import model_dir

            folder = model_dir()
            if folder is None:
                return None
            # Its files alone: a web process in front of an inference server never imports torch.
            from ..engine.text.file_tokenizer import FileTokenizer

            self._tokenizer = FileTokenizer(folder)
        return self._tokenizer

    def wait(self, timeout: float | None = None) -> bool:
        self._ready.wait(timeout)
        return self.state == "ready"

    def require(self) -> tuple[Backend, SchedulerStack]:
        """(backend, scheduler stack), or NotReady with a message a user can read."""
        if self.draining:
            raise NotReady(
                "the server is restarting and takes no new prompts; send it again in a moment",
                code=SERVER_RESTARTING,
            )
        if self.state == "ready":
            assert self.backend is not None and self.stack is not None  # set before "ready"
            return self.backend, self.stack
        if self.state == "failed":
            raise NotReady(f"the model failed to load: {self.detail}")
        raise NotReady(f"the model is still loading ({self.detail}); try again in a few seconds")


runtime = Runtime()
