"""What the model is asked: the chat fitted into its context, the request, and the cache key.

No database and no I/O: a turn's inputs in, the model's input out.
"""

from __future__ import annotations

from dataclasses import fields

from ..engine.types import PENALTY_LIMITS, Backend, GenerationRequest
from ..stores.cache import cache_key
from ..stores.policy_store import ResolvedPolicy


def fit_prompt(
    backend: Backend,
    policy: ResolvedPolicy,
    history: list[dict],
    text: str,
    *,
    answer_so_far: str = "",
) -> tuple[list[dict], str, list[int]]:
    """(messages, rendered prompt, input ids); drops the oldest turns when the context is full,
    never the new prompt. Raises PromptTooLong when even the prompt alone does not fit.

    With `answer_so_far` the chat ends on that unfinished answer, for the model to go on with.
    """
    max_new_tokens = policy.max_new_tokens
    head = [{"role": "system", "content": policy.system_prompt}] if policy.system_prompt else []
    for user, assistant in policy.examples:
        head += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    tail = [{"role": "assistant", "content": answer_so_far}] if answer_so_far else []
    while True:
        messages = head + history + [{"role": "user", "content": text}] + tail
        rendered = backend.render(messages)
        input_ids = backend.encode(messages)
        if len(input_ids) + max_new_tokens <= backend.context_length or not history:
            backend.check_fits(len(input_ids), max_new_tokens)
            return messages, rendered, input_ids
        history = history[2:]


def request_for(
    backend: Backend,
    policy: ResolvedPolicy,
    input_ids: list[int],
    label: str,
    messages: list[dict],
) -> GenerationRequest:
    """The engine request for a fitted prompt under `policy`."""
    eos_ids = tuple(
        i for i in (backend.token_id(t) for t in policy.extra_eos_tokens) if i is not None
    )
    return GenerationRequest(
        input_ids=input_ids,
        max_new_tokens=policy.max_new_tokens,
        stop_strings=policy.stop_strings,
        eos_token_ids=eos_ids,
        temperature=policy.temperature,
        top_p=policy.top_p,
        repetition_penalty=policy.repetition_penalty,
        no_repeat_ngram_size=policy.no_repeat_ngram_size,
        frequency_penalty=policy.frequency_penalty,
        presence_penalty=policy.presence_penalty,
        json_schema=policy.schema if policy.constrained else None,
        tool_grammar=policy.tools.grammar() if policy.tools is not None else None,
        label=label,
        messages=messages,
    )


_NEUTRAL_PENALTIES = {
    f.name: f.default for f in fields(GenerationRequest) if f.name in PENALTY_LIMITS
}


def turn_cache_key(
    backend: Backend, policy: ResolvedPolicy, rendered: str, request: GenerationRequest
) -> str:
    """Everything that decides the answer: model and weights, prompt, parameters, policy version."""
    params = {
        "max_new_tokens": min(request.max_new_tokens, backend.config.max_new_tokens_cap),
        "stop_strings": list(request.stop_strings),
        "eos_token_ids": sorted({*backend.eos_token_ids, *request.eos_token_ids}),
        "temperature": request.temperature,
        "top_p": request.top_p,
        "json_schema": request.json_schema,
    }
    if request.tool_grammar is not None:  # only then, so other keys stay as they were
        params["tool_grammar"] = request.tool_grammar
    # Only when set, so the keys of answers made without penalties stay as they were.
    params.update(
        (name, getattr(request, name))
        for name, neutral in _NEUTRAL_PENALTIES.items()
        if getattr(request, name) != neutral
    )
    if policy.overrides:  # only then, so the keys of every unchanged policy stay as they were
        params["overrides"] = policy.overrides
    return cache_key(
        model_id=backend.model_id,
        fingerprint=backend.fingerprint,
        rendered_prompt=rendered,
        params=params,
        policy_slug=policy.slug,
        policy_version=policy.version,
    )
