"""The engines beside the default one: one scheduler stack each, built when first needed.

The default engine (CHAT_BACKEND, CHAT_REMOTE, CHAT_MODEL_PATH) is the runtime's own stack. An
`Engine` row adds another: a remote one is built on its first prompt (a few short questions to
the server), a local one loads in the background on its first prompt or at start. Each has its
own stack, queue and lock, so one engine that is down, slow or loading holds no other up. An
engine that failed is refused at once (`engine_unavailable`) for `RETRY_SECONDS`, then tried again.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from ..engine.remote.stream import Endpoint
from ..engine.stack import SchedulerStack, StackConfig, build_stack
from ..engine.types import Backend

log = logging.getLogger(__name__)

ENGINE_UNAVAILABLE = "engine_unavailable"
# How long an engine that failed is refused before it is tried again.
RETRY_SECONDS = 5.0
# How often an engine's answers update its row's `last_seen_at` (the admin's), at most.
SEEN_EVERY_SECONDS = 60.0
# A second local model loads only when its weights, this many times over, fit the free memory.
MEMORY_HEADROOM = 1.5


@dataclass(frozen=True)
class EngineSpec:
    """An `Engine` row as plain data: what the runtime builds from, and the answer's identity."""

    id: int
    name: str
    slug: str
    kind: str  # "local" | "remote"
    model_path: str = ""
    api_root: str = ""
    served_model: str = ""
    api_key_variable: str = ""
    max_concurrency: int = 8
    context_length: int = 0
    timeout_seconds: float = 60.0
    cost_weight: float = 1.0
    enabled: bool = True

    @classmethod
    def of(cls, row: Any) -> EngineSpec:
        return cls(
            id=row.pk,
            name=row.name,
            slug=row.slug,
            kind=row.kind,
            model_path=row.model_path,
            api_root=row.api_root,
            served_model=row.served_model,
            api_key_variable=row.api_key_variable,
            max_concurrency=row.max_concurrency,
            context_length=row.context_length,
            timeout_seconds=row.timeout_seconds,
            cost_weight=row.cost_weight,
            enabled=row.enabled,
        )

    def built_from(self) -> tuple:
        """What its stack is built from: a change to any of these builds it anew."""
        return (
            self.kind,
            self.model_path,
            self.api_root.rstrip("/"),
            self.served_model,
            self.api_key_variable,
            self.max_concurrency,
            self.context_length,
            self.timeout_seconds,
        )

    def identity(self) -> dict[str, Any]:
        """Which engine made an answer (chat/turns/identity.py): its kind and where it runs."""
        if self.kind == "remote":
            return {
                "kind": "remote",
                "api_root": self.api_root.rstrip("/"),
                "model": self.served_model,
            }
        return {"kind": "local", "model_path": self.model_path}


class NotServing(RuntimeError):
    """An engine that cannot take a prompt now; `code` is the wire's error code."""

    def __init__(self, message: str, code: str = ENGINE_UNAVAILABLE):
        super().__init__(message)
        self.code = code


class EngineSlot:
    """One engine's stack, its state and its own lock."""

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.backend: Backend | None = None
        self.stack: SchedulerStack | None = None
        self.state = "idle"  # idle -> loading -> ready | failed
        self.detail = ""
        self.down_until = 0.0
        self.shared = False  # the default engine's stack, not this slot's to close
        self.recorded_at = float("-inf")  # when `last_seen_at` was last written
        self.lock = threading.Lock()

    def mark_down(self, detail: str) -> None:
        self.down_until = time.monotonic() + RETRY_SECONDS
        self.detail = detail
        _record(self.spec.id, error=detail)

    def close(self) -> None:
        if self.stack is not None and not self.shared:
            self.stack.close()


class EngineSlots:
    """Every engine row's slot in this process, by the row's id."""

    def __init__(
        self,
        stack_config: Callable[[], StackConfig],
        engine_config: Callable[[], Any],
        remote_config: Callable[[], Any],
        share_default: Callable[[str], tuple[Backend, SchedulerStack] | None],
    ):
        self._stack_config = stack_config
        self._engine_config = engine_config
        self._remote_config = remote_config
        # (backend, stack) of the default engine when a local row names the same weights.
        self._share_default = share_default
        self._slots: dict[int, EngineSlot] = {}
        # Stacks whose row changed while they still ran answers: closed once idle.
        self._retired: list[EngineSlot] = []
        self._lock = threading.Lock()

    def slots(self) -> list[EngineSlot]:
        with self._lock:
            return list(self._slots.values())

    def get(self, spec: EngineSpec) -> tuple[Backend, SchedulerStack]:
        """The engine's backend and stack, built now if remote; NotServing says why not."""
        if not spec.enabled:
            raise NotServing(f"the engine {spec.name} is turned off")
        slot = self._slot(spec)
        if time.monotonic() < slot.down_until:
            raise NotServing(f"the engine {spec.name} is unavailable ({slot.detail})")
        if slot.down_until and slot.state == "ready":
            self._probe(slot)  # it was down: asked again (a second at most) before it is trusted
        if slot.state == "ready" and slot.backend is not None and slot.stack is not None:
            return slot.backend, slot.stack
        if spec.kind == "local":
            self._load_local(slot)
            if slot.state == "ready":
                assert slot.backend is not None and slot.stack is not None
                return slot.backend, slot.stack
            raise NotServing(
                f"the engine {spec.name} is still loading ({slot.detail}); try again shortly",
                code="model_loading",
            )
        with slot.lock:  # one build at a time, of this engine only
            if slot.state != "ready":
                self._build_remote(slot)
        assert slot.backend is not None and slot.stack is not None
        return slot.backend, slot.stack

    def _probe(self, slot: EngineSlot) -> None:
        with slot.lock:
            if not slot.down_until:
                return
            status = unreachable(slot.spec) if slot.spec.kind == "remote" else ""
            if status:
                slot.mark_down(status)
                raise NotServing(f"the engine {slot.spec.name} is unavailable ({status})")
            slot.down_until = 0.0
            _record(slot.spec.id, error="")

    def statuses(self) -> dict[str, str]:
        """Each engine this process has used, by slug: "ok", or what is wrong (for /healthz)."""
        found = {}
        for slot in self.slots():
            if time.monotonic() < slot.down_until or slot.state == "failed":
                found[slot.spec.slug] = f"unavailable: {slot.detail}"
            elif slot.state == "ready":
                found[slot.spec.slug] = "ok"
            else:
                found[slot.spec.slug] = f"{slot.state}: {slot.detail}"
        return found

    def seen_due(self, spec: EngineSpec) -> bool:
        """Whether an answer from `spec` should update its row's `last_seen_at` now."""
        slot = self._slots.get(spec.id)
        return slot is not None and time.monotonic() - slot.recorded_at >= SEEN_EVERY_SECONDS

    def seen(self, spec: EngineSpec) -> None:
        """An answer came from `spec`: its row says when (once a minute at most)."""
        slot = self._slots.get(spec.id)
        if slot is not None:
            slot.recorded_at = time.monotonic()
            _record(spec.id, error="")

    def failed(self, spec: EngineSpec, detail: str) -> None:
        """An answer on `spec` found it unreachable: refuse it for a while (then try again)."""
        self._slot(spec).mark_down(detail)

    def load_at_start(self, specs: list[EngineSpec], progress) -> None:
        """Start loading the enabled local engines, one progress line each."""
        for spec in specs:
            if spec.kind == "local" and spec.enabled:
                progress(f"Engine {spec.name}: loading {spec.model_path or 'the bundled model'}")
                self._load_local(self._slot(spec), wait=True)
                progress(f"Engine {spec.name}: {self._slot(spec).detail}")

    def close(self) -> None:
        """Every slot's stack closed and forgotten (its row is built anew when next used)."""
        for slot in self.slots():
            slot.close()
        with self._lock:
            for slot in self._retired:
                slot.close()
            self._slots.clear()
            self._retired.clear()

    def _slot(self, spec: EngineSpec) -> EngineSlot:
        with self._lock:
            slot = self._slots.get(spec.id)
            self._close_idle_retired()
            if slot is None or slot.spec.built_from() != spec.built_from():
                if slot is not None:  # its row changed: built anew, the old one serves out
                    self._retired.append(slot)
                    self._close_idle_retired()
                slot = self._slots[spec.id] = EngineSlot(spec)
            elif slot.spec != spec:
                slot.spec = spec  # name, weight or enabled: nothing to rebuild
            return slot

    def _close_idle_retired(self) -> None:
        still = []
        for slot in self._retired:
            base = slot.stack.base if slot.stack is not None else None
            if base is not None and (base.running or base.waiting):
                still.append(slot)
            else:
                slot.close()
        self._retired = still

    def _build_remote(self, slot: EngineSlot) -> None:
        from ..engine.remote.openai_backend import OpenAIBackend

        spec = slot.spec
        # Asked first, a second at most: a server that refuses or says nothing is refused now,
        # not after the start-up questions' own waits.
        silent = unreachable(spec)
        if silent:
            slot.mark_down(silent)
            raise NotServing(f"the engine {spec.name} is unavailable: {silent}")
        config = replace(
            self._remote_config(),
            base_url=spec.api_root.rstrip("/"),
            model=spec.served_model,
            api_key=settings.CHAT_HOOK_SECRETS.get(spec.api_key_variable, "") or "",
            timeout=spec.timeout_seconds,
            context_length=spec.context_length,
        )
        try:
            backend = OpenAIBackend.from_config(
                config, progress=lambda line: log.info("engine %s: %s", spec.slug, line)
            )
            stack = build_stack(
                backend,
                replace(self._stack_config(), max_running=spec.max_concurrency, global_capacity=0),
            )
        except Exception as exc:
            log.warning("engine %s could not be reached: %s", spec.slug, exc)
            slot.state = "failed"
            slot.mark_down(f"{type(exc).__name__}: {exc}"[:300])
            raise NotServing(f"the engine {spec.name} is unavailable: {exc}") from None
        slot.backend, slot.stack, slot.state, slot.detail = backend, stack, "ready", "ready"
        _record(spec.id, error="")

    def _load_local(self, slot: EngineSlot, wait: bool = False) -> None:
        with slot.lock:
            if slot.state in {"loading", "ready"}:
                return
            shared = self._share_default(slot.spec.model_path)
            if shared is not None:  # the default's own weights: one copy, one queue
                slot.backend, slot.stack = shared
                slot.shared = True
                slot.state, slot.detail = "ready", "shares the default engine's model"
                return
            slot.state, slot.detail = "loading", "starting"
        thread = threading.Thread(
            target=self._load, args=(slot,), name=f"engine-{slot.spec.slug}", daemon=True
        )
        thread.start()
        if wait:
            thread.join()

    def _load(self, slot: EngineSlot) -> None:
        from ..engine.local.loader import load_backend

        spec = slot.spec
        try:
            refusal = memory_refusal(spec)
            if refusal:
                raise MemoryError(refusal)

            def progress(line: str) -> None:
                slot.detail = line.strip()
                log.info("engine %s: %s", spec.slug, line)

            backend = load_backend(
                replace(self._engine_config(), model_path=spec.model_path or None),
                progress=progress,
            )
            slot.stack = build_stack(
                backend, replace(self._stack_config(), max_batch=spec.max_concurrency)
            )
            slot.backend = backend
        except Exception as exc:
            log.error("engine %s failed to load: %s", spec.slug, exc)
            slot.state = "failed"
            slot.mark_down(f"{type(exc).__name__}: {exc}"[:300])
            slot.down_until = float("inf")  # a local model that did not load stays refused
        else:
            slot.state, slot.detail = "ready", f"{backend.model_id} loaded"
            _record(spec.id, error="")


def unreachable(spec: EngineSpec, timeout: float = 1.0) -> str:
    """Why a remote engine's server does not answer HTTP within `timeout`, or "" when it does.

    Any answer counts (`transformers serve` answers its model list with a 500): this asks only
    whether something is there and talking, which `probe` cannot say once a stream has failed."""
    endpoint = Endpoint(spec.api_root.rstrip("/"), "")
    connection = endpoint.connection(timeout)
    try:
        connection.request("GET", f"{endpoint.path}/models", headers=endpoint.headers())
        connection.getresponse().read(1 << 16)
        return ""
    except (OSError, http.client.HTTPException) as exc:
        return f"no answer from {spec.api_root}: {exc or type(exc).__name__}"
    finally:
        connection.close()


def memory_refusal(spec: EngineSpec) -> str:
    """Why a local engine's weights would not fit in the free memory, or ""."""
    path = Path(spec.model_path)
    if not spec.model_path or not path.exists():
        return ""  # the loader says what is missing
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    weights = sum(p.stat().st_size for p in files)
    free = available_memory()
    if free is not None and weights * MEMORY_HEADROOM > free:
        return (
            f"the engine {spec.name} needs about {weights * MEMORY_HEADROOM / 2**20:.0f} MiB "
            f"for {spec.model_path} and {free / 2**20:.0f} MiB are free; it was not loaded"
        )
    return ""


def available_memory() -> int | None:
    """Bytes of memory free for a new model (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _record(engine_id: int, *, error: str) -> None:
    """What was last heard from an engine, kept on its row for the admin (never fatal)."""
    from ..models import Engine

    try:
        if error:
            Engine.objects.filter(pk=engine_id).update(last_error=error[:300])
        else:
            Engine.objects.filter(pk=engine_id).update(last_seen_at=timezone.now(), last_error="")
    except Exception as exc:  # the database may be away; the engine's state is in memory anyway
        log.debug("could not record engine %s: %s", engine_id, exc)
