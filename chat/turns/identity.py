"""An answer's identity: one sha256 of exactly what made it.

Computed once, when a turn is prepared, and stored on its message. The completion cache, the
sharing of generations in flight (in this process and across processes) and the review record
are all keyed by it, so an answer reaches another user only when everything that decided it was
the same: the model's exact input ids and the tokenizer that made them (the user's custom
instructions among them, in the system message), the weights and how they are computed, the
policy and its effective settings, and every decoding setting.

An answer that is not reproducible, or whose context the server does not hold, has no identity
and is never shared (docs/policies.md, "What makes two answers the same").
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..engine.types import Backend, GenerationRequest
from ..infra.engines import EngineSpec
from ..models import OutputPolicy
from ..stores.policy_store import ResolvedPolicy


def engine_identity(backend: Backend, engine: EngineSpec) -> dict[str, Any]:
    """Which engine row answers: its kind and where it runs, and for a server what it was found
    to accept (capabilities.py: a refused field is never sent, so answers differ)."""
    found = {**engine.identity(), "row": engine.id}
    capabilities = getattr(backend, "capabilities", None)
    if capabilities is not None:
        found["server"] = capabilities.identity()
    return found


def policy_digest(policy: ResolvedPolicy) -> str:
    """sha256 of every setting of `policy` that shapes an answer, as a turn uses them: the stored
    row's (hooks included) with one request's changes applied."""
    effective = {
        "mode": policy.mode,
        "schema": policy.schema,
        "constrained": policy.constrained,
        "examples": policy.examples,
        "holdback_chars": policy.holdback_chars,
        "failure_action": policy.failure_action,
        "fallback_text": policy.fallback_text,
        "max_retries": policy.max_retries,
        "system_prompt": policy.system_prompt,
        "sampling": policy.sampling.identity(),
        "extra_eos_tokens": policy.extra_eos_tokens,
        "tools": policy.tools.as_dict() if policy.tools is not None else None,
        "stored": {k: v for k, v in policy.snapshot.items() if k not in OutputPolicy.PRESENTATION},
        "overrides": policy.overrides,
    }
    canonical = json.dumps(effective, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def identity_inputs(
    backend: Backend,
    policy: ResolvedPolicy,
    request: GenerationRequest,
    engine: EngineSpec | None = None,
) -> dict[str, Any]:
    """Everything that decides the answer, as plain JSON. The default engine (None) adds
    nothing, so its answers keep the identities they had before there were engine rows."""
    params = request.params
    effective = params.with_changes(
        max_new_tokens=min(params.max_new_tokens, backend.config.max_new_tokens_cap),
        eos_token_ids=tuple(sorted({*backend.eos_token_ids, *params.eos_token_ids})),
    )
    return {
        "model": backend.model_identity(),
        "input_ids": list(request.input_ids),
        "messages": request.messages,  # what a remote server reads instead of the ids
        "policy": {"id": policy.id, "slug": policy.slug, "settings": policy_digest(policy)},
        "sampling": effective.identity(),
    } | ({"engine": engine_identity(backend, engine)} if engine is not None else {})


def answer_identity(
    backend: Backend,
    policy: ResolvedPolicy,
    request: GenerationRequest,
    *,
    client_context: bool,
    engine: EngineSpec | None = None,
) -> str | None:
    """The identity of the answer `request` will produce; None when it must never be shared:
    sampled without a seed, or `client_context` (history or instructions the client sent)."""
    if client_context or not request.params.reproducible:
        return None
    canonical = json.dumps(
        identity_inputs(backend, policy, request, engine),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
